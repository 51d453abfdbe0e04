"""Memory one update micro-step adds over weights and gradients, at Qwen2.5-1.5B's real widths, on CPU.

Not collected by pytest (the name does not start with test_). Run: python tests/bench_memory.py
Compares the naive path (full-vocabulary fp32 logits and log-softmax over every position) with ours
(`compute_logprobs_from_model` with prompt_length: LM head on completion positions only, in chunks,
recomputed in backward). Each path runs in its own process; the kernel's peak RSS is reset
(/proc/self/clear_refs) after the model and its gradients exist, so construction does not hide the step.
"""
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402

SEQUENCES, PROMPT, COMPLETION = 4, 128, 384   # one micro-batch of the CLI defaults' shape, shortened for a CPU


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def measure(path: str) -> float:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=2,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (SEQUENCES, PROMPT + COMPLETION))
    mask = torch.ones_like(ids)
    for p in model.parameters():                      # gradients exist before the measured step, as in training
        p.grad = torch.zeros_like(p)
    Path("/proc/self/clear_refs").write_text("5")
    base = rss_mb("VmRSS")
    if path == "body":          # transformer layers and tied-embedding gradient only: what both paths share
        model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, PROMPT:].float().mean().backward()
        return rss_mb("VmHWM") - base
    if path == "naive":
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logprobs = logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
        logprobs = logprobs[:, PROMPT - 1:]
    else:
        logprobs = gh.compute_logprobs_from_model(model, ids, mask, prompt_length=PROMPT)[:, PROMPT:]
    logprobs.mean().backward()
    return rss_mb("VmHWM") - base


if __name__ == "__main__":
    if len(sys.argv) == 2:
        print(measure(sys.argv[1]))
        sys.exit(0)
    print(f"one micro-step: {SEQUENCES} sequences x ({PROMPT} prompt + {COMPLETION} completion) tokens, "
          f"Qwen2.5-1.5B widths, 2 layers, fp32 on CPU")
    added = {path: float(subprocess.run([sys.executable, __file__, path], capture_output=True, text=True,
                                        check=True).stdout.split()[-1]) for path in ("naive", "ours", "body")}
    print(f"{'path':<8}{'peak memory added (MB)':>26}")
    for path, mb in added.items():
        print(f"{path:<8}{mb:>26.0f}")
    print(f"ours / naive = {added['ours'] / added['naive']:.2f} (target <= 0.33)")
    lm_naive, lm_ours = added["naive"] - added["body"], added["ours"] - added["body"]
    print(f"above the shared body: naive {lm_naive:.0f} MB, ours {lm_ours:.0f} MB, ratio {lm_ours / lm_naive:.2f}")
