"""bf16 against fp32 on this CPU, side by side in one run: what `--dtype auto` chooses between on a CPU.

The three phases of a run, each timed in both precisions on the same model, prompts and seed: generation (a step's
sampling, G samples per prompt at temperature 1), the update (train_grpo's update, update_once, on that rollout, every row given a
nonzero advantage so that every row runs forward and backward) and the evaluation (greedy answers, with the
weights frozen as under LoRA or for the KL reference: the case where a strided LM-head input in bf16 used to
make oneDNN broadcast the head's weight, see contiguous_lm_head_input). Each precision warms up first (one short
generation and one update on 2 rows). The last line says whether oneDNN was still on at the end: PyTorch turns it off
for the whole process after an allocation fails inside it, and every bf16 matmul after that is ~10x slower.

Not collected by pytest (tests/test_cli.py runs it once at a tiny size). Time it alone: two 2-thread jobs on
2 cores slow each other many times over.
    python tests/bench_dtype.py MODEL_DIR                 # 2 prompts x 8 x 64 tokens; 16 problems greedy
    python tests/bench_dtype.py MODEL_DIR --max-new-tokens 128 --eval-size 32
"""
import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402
from conftest import update_once  # noqa: E402  (train_grpo's step 4 on a rollout made here)
from bench_step import GSM8K, sampled_rollout  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(args, dtype: str) -> dict:
    device = torch.device("cpu")
    torch.manual_seed(0)
    model, tokenizer = gh.load_model_and_tokenizer(args.model, device, dtype)
    cfg = dataclasses.replace(gh.RunConfig(), dataset=args.dataset, batch_size=args.batch_size,
                              group_size=args.group_size, max_new_tokens=args.max_new_tokens, temperature=1.0,
                              micro_batch_size=args.micro_batch_size, generation_batch_size=64,
                              eval_batch_size=args.eval_size, learning_rate=1e-6)
    problems = gh.GSM8KDataset(f"train[:{args.batch_size}]", tokenizer, dataset_path=args.dataset)
    batch = gh.collate_prompts([problems[i] for i in range(len(problems))], tokenizer)
    optimizer = gh.build_optimizer(model.parameters(), cfg.learning_rate)
    warm = dataclasses.replace(cfg, group_size=2, max_new_tokens=4, micro_batch_size=2)
    small = {k: v[:1] if torch.is_tensor(v) or isinstance(v, list) else v for k, v in batch.items()}
    warm_rollout = sampled_rollout(model, tokenizer, small, warm, device)
    update_once(model, optimizer, dataclasses.replace(warm_rollout, advantages=torch.ones(2)), warm)
    out = {}
    torch.manual_seed(1)
    out["generation"], rollout = timed(lambda: sampled_rollout(model, tokenizer, batch, cfg, device))
    spread = dataclasses.replace(rollout, advantages=torch.randn(rollout.advantages.shape,
                                                                 generator=torch.Generator().manual_seed(0)))
    out["update"], _ = timed(lambda: update_once(model, optimizer, spread, cfg))
    model.requires_grad_(False)
    eval_set = gh.GSM8KDataset(f"test[:{args.eval_size}]", tokenizer, dataset_path=args.dataset)
    out["evaluation (frozen weights)"], _ = timed(lambda: gh.evaluate(model, tokenizer, eval_set, cfg, device))
    out["tokens"] = (rollout.completion_lengths.sum().item(), rollout.output_ids.shape)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--dataset", default=str(GSM8K), help="hub-layout GSM8K folder")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--eval-size", type=int, default=16)
    args = parser.parse_args()
    results = {dtype: measure(args, dtype) for dtype in ("float32", "bfloat16")}
    print(f"\n{args.model} on {torch.get_num_threads()} CPU threads, torch {torch.__version__}: {args.batch_size} "
          f"prompts x {args.group_size} samples x {args.max_new_tokens} new tokens (micro-batch "
          f"{args.micro_batch_size}); evaluation {args.eval_size} problems greedy, {args.max_new_tokens} tokens")
    for dtype, r in results.items():
        print(f"{dtype}: {r['tokens'][0]} completion tokens sampled, rollout {list(r['tokens'][1])}")
    print("\n| phase (seconds) | float32 | bfloat16 | float32 / bfloat16 |\n|---|---|---|---|")
    for phase in ("generation", "update", "evaluation (frozen weights)"):
        fp32, bf16 = results["float32"][phase], results["bfloat16"][phase]
        print(f"| {phase} | {fp32:.2f} | {bf16:.2f} | {fp32 / bf16:.2f}x |")
    print(f"\noneDNN still on at the end: {torch.backends.mkldnn.enabled}")


if __name__ == "__main__":
    main()
