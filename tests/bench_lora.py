"""LoRA (--lora-rank) against full fine-tuning on a real model: seconds per step phase, peak memory, checkpoint size.

Both modes load the same weights and sample the same rollout (the same seed; LoRA's B starts at 0, so the two
policies are the same distribution at the start), then time, each in its own process so that peak memory is its
own: generation (generate_completions), the update's forward and backward (train_grpo's, update_once, with every row given a
random nonzero advantage, so every row runs), the optimizer step alone, and what a checkpoint writes
(save_model). Peak memory is the process's peak RSS after the model is loaded (/proc/self/clear_refs), so it is
what the step adds over the weights.

Not collected by pytest. On the real SmolLM2-135M-Instruct (built by .ci/run), 2 threads, alone:
    python tests/bench_lora.py                                      # 2 prompts x 8 x 64 tokens, rank 16, fp32
    python tests/bench_lora.py ~/models/Qwen2.5-Coder-0.5B-Instruct --max-new-tokens 128
"""
import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402
from conftest import update_once  # noqa: E402  (train_grpo's step 4 on a rollout made here)
from bench_step import SMOLLM2, sampled_rollout  # noqa: E402


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def measure(args) -> dict:
    """One mode's figures, in this process."""
    cfg = dataclasses.replace(gh.RunConfig(), task="arithmetic", batch_size=args.batch_size, group_size=args.group_size,
                              max_new_tokens=args.max_new_tokens, temperature=0.7, micro_batch_size=8,
                              generation_batch_size=args.batch_size * args.group_size, learning_rate=1e-5,
                              lora_rank=args.lora_rank if args.mode == "lora" else 0, gradient_checkpointing="off")
    torch.manual_seed(0)
    model, tokenizer = gh.load_model_and_tokenizer(args.model, torch.device("cpu"), "float32")
    if cfg.lora_rank:
        model = gh.with_lora(model, cfg, None)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = gh.build_optimizer(trained, cfg.learning_rate)
    problems = gh.TaskDataset(f"train[:{args.batch_size}]", tokenizer, 512, prompt_style="chat", dataset_path="",
                              task=gh.TASKS["arithmetic"])
    batch = gh.collate_prompts([problems[i] for i in range(args.batch_size)], tokenizer)
    Path("/proc/self/clear_refs").write_text("5")
    base, out = rss_mb("VmRSS"), {}
    for step in range(args.steps + 1):             # step 0 warms up (first calls allocate and dispatch)
        torch.manual_seed(step)
        t0 = time.perf_counter()
        rollout = sampled_rollout(model, tokenizer, batch, cfg, torch.device("cpu"))
        t1 = time.perf_counter()
        rollout = dataclasses.replace(rollout, advantages=torch.randn(rollout.advantages.shape,
                                                                      generator=torch.Generator().manual_seed(step)))
        real_step, seconds = optimizer.step, {}

        def timed_step():
            t = time.perf_counter()
            real_step()
            seconds["optimizer"] = time.perf_counter() - t
        optimizer.step = timed_step
        try:
            update_once(model, optimizer, rollout, cfg)
        finally:
            optimizer.step = real_step
        t2 = time.perf_counter()
        if step:
            for key, value in (("generation", t1 - t0), ("update without optimizer", t2 - t1 - seconds["optimizer"]),
                               ("optimizer", seconds["optimizer"])):
                out[key] = out.get(key, 0.0) + value / args.steps
    out["peak memory over the weights (MB)"] = rss_mb("VmHWM") - base
    with tempfile.TemporaryDirectory() as folder:
        gh.save_model(Path(folder) / "checkpoint", model, tokenizer)
        gh.to_plain(optimizer.state_dict(), tensors := {})      # the optimizer state's tensors, as a checkpoint has
        from safetensors.torch import save_file
        save_file(tensors, Path(folder) / "checkpoint" / "optimizer.safetensors")
        out["checkpoint (MB)"] = sum(f.stat().st_size for f in (Path(folder) / "checkpoint").rglob("*")
                                     if f.is_file()) / 2**20
    out["trained parameters (M)"] = sum(p.numel() for p in trained) / 1e6
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=SMOLLM2)
    parser.add_argument("--mode", choices=["full", "lora"], help="measure one mode in this process (internal)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args)))
        return
    runs = {}
    for mode in ("full", "lora"):
        result = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode], capture_output=True,
                                text=True, check=True)
        runs[mode] = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"{args.model}, fp32 on CPU, {torch.get_num_threads()} threads: {args.batch_size} prompts x "
          f"{args.group_size} samples x {args.max_new_tokens} new tokens, micro-batch 8, LoRA rank {args.lora_rank} "
          f"on all linear layers; seconds are the mean of {args.steps} steps after a warm-up step\n")
    print("| | full fine-tuning | LoRA | LoRA / full |\n|---|---|---|---|")
    for key in runs["full"]:
        full, lora = runs["full"][key], runs["lora"][key]
        print(f"| {key} | {full:.2f} | {lora:.2f} | {lora / full:.2f} |")


if __name__ == "__main__":
    main()
