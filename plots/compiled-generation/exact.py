"""Is the compiled generation (CompiledGeneration: static KV cache + torch.compile) exact on real weights? (#95)

Qwen2.5-Coder-0.5B-Instruct (tests/build_qwen_coder.py) in fp32 on a CPU, GSM8K train problems 0-15 in the runs'
chat prompt (no test problem is looked at), 256 new tokens:
1. greedy: the compiled path's tokens against today's (dynamic cache), row by row;
2. sampled at T 0.7 (4 problems x 4 samples): the log-probs the compiled sampler drew each token with, against
   compute_logprobs_from_model's on the same sequences (the scorer-agreement tolerance, 2e-4).
Writes exact.txt beside this file. Run alone (2 CPU cores): python plots/compiled-generation/exact.py MODEL_DIR
"""
import copy
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
import grpo_homework as gh  # noqa: E402

TOLERANCE = 2e-4


def main(model_dir: str) -> int:
    lines = []
    say = lambda text: (print(text, flush=True), lines.append(text))
    torch.manual_seed(0)
    model, tokenizer = gh.load_model_and_tokenizer(model_dir, torch.device("cpu"), "float32")
    data = gh.TaskDataset("train[:16]", tokenizer, 512, dataset_path=str(HERE.parents[2] / "shared" / "gsm8k"),
                          prompt_style="chat", task=gh.TASKS["gsm8k"])
    batch = gh.collate_prompts([data[i] for i in range(16)], tokenizer)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    plain = model.generate
    compiled = gh.CompiledGeneration(model, lambda: (16,), everywhere=True)
    say(f"{model_dir}: fp32, torch {torch.__version__}; 16 GSM8K train problems, prompts {mask.sum(1).min().item()}-"
        f"{mask.sum(1).max().item()} tokens (padded to {ids.shape[1]}), greedy, 256 new tokens")
    outs = {}
    for name, generate in (("dynamic", plain), ("compiled", compiled), ("compiled again", compiled)):
        model.generate = generate
        t0 = time.perf_counter()
        outs[name] = gh.generate_completions(model, tokenizer, ids, mask, 256, 0.0, 1, batch_size=16)
        say(f"  {name}: {time.perf_counter() - t0:.0f} s, {outs[name]['completion_lengths'].sum().item()} tokens")
    a, b = (outs[n]["output_ids"] for n in ("dynamic", "compiled"))
    same = [torch.equal(x, y) for x, y in zip(a, b)]
    say(f"greedy: {sum(same)} of 16 rows identical token for token (the first differing row: "
        f"{same.index(False) if False in same else '-'}); compiled path fell back: {compiled.failed}")

    # 2. sampled: the compiled sampler's own log-probs of its tokens vs the scorer's
    seen = []

    def capture(**kwargs):
        config = copy.deepcopy(kwargs["generation_config"])
        config.update(output_logits=True, return_dict_in_generate=True)
        out = plain(**{**kwargs, "generation_config": config})
        seen.append(out)
        return out.sequences
    compiled.plain, model.generate = capture, compiled
    torch.manual_seed(1)
    sample = gh.generate_completions(model, tokenizer, ids[:4], mask[:4], 256, 0.7, 4, batch_size=16)
    logits = torch.stack(seen[-1].logits, 1)[:16]                  # [rows, new, vocab] as sampled (before / T)
    new = sample["output_ids"][:, sample["prompt_length"]:]
    drawn = (logits.float() / 0.7).log_softmax(-1).gather(-1, new[:, :logits.shape[1], None])[..., 0]
    scored = gh.compute_logprobs_from_model(model, sample["output_ids"], sample["attention_mask"], temperature=0.7,
                                            prompt_length=sample["prompt_length"]).detach()[:, sample["prompt_length"]:]
    keep = sample["completion_mask"][:, sample["prompt_length"]:].bool()[:, :logits.shape[1]]
    gap = (drawn - scored[:, :logits.shape[1]]).abs()[keep]
    say(f"sampled at T 0.7 (4 problems x 4): {int(keep.sum())} tokens; the compiled sampler's log-probs vs "
        f"compute_logprobs_from_model: max {gap.max().item():.1e}, mean {gap.mean().item():.1e}; within "
        f"{TOLERANCE:g}: {bool(gap.max() <= TOLERANCE)}")
    (HERE / "exact.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
