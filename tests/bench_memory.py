"""Memory one update micro-step adds over weights and gradients, at Qwen2.5-1.5B's real widths, on CPU.

Both weight precisions: bf16 is what the CLI trains in on a GPU, fp32 is shown beside it.

Not collected by pytest (the name does not start with test_). Run: python tests/bench_memory.py [--against REV]
(--against adds a column measured with revision REV's compute_logprobs_from_model, read with git show).
Compares the naive path (full-vocabulary fp32 logits and log-softmax over every position, prompt included) with
TODO 4 (`compute_logprobs_from_model`, what the update calls: the model's own logits of the completion positions
only, through logits_to_keep, then / T and log-softmax in fp32) at one micro-batch of the defaults' shape, in peak
memory and seconds. Each path runs in its own process; the kernel's peak RSS is reset (/proc/self/clear_refs) after
the model and its gradients exist, so construction does not hide the step. 'body' is the transformer layers and
the tied-embedding gradient alone, which every path shares: what a path adds above it is the log-prob pass's cost.

Then the optimizer step on Qwen2.5-1.5B's largest tensor, the tied 151,936 x 1,536 embedding, as on the GPU (bf16
weight and gradient, fp32 moments, stochastic rounding): the memory the step adds over weight, gradient and
moments, for the whole-tensor step this script had until the GPU precision issue and for today's sliced step.
"""
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402

# one micro-batch of the CLI defaults (--micro-batch-size 4, --max-new-tokens 256; a GSM8K chat prompt is ~128)
SEQUENCES, PROMPT, COMPLETION = 4, 128, 256


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def whole_tensor_step(p, state, lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """The previous AdamWStochasticRounding.step for one tensor: ~6 fp32-sized temporaries at once."""
    state["step"] += 1
    grad = p.grad.float()
    state["exp_avg"].lerp_(grad, 1 - betas[0])
    state["exp_avg_sq"].mul_(betas[1]).addcmul_(grad, grad, value=1 - betas[1])
    bias1, bias2 = 1 - betas[0] ** state["step"], 1 - betas[1] ** state["step"]
    denom = (state["exp_avg_sq"] / bias2).sqrt_().add_(eps)
    weight = p.float()
    weight.mul_(1 - lr * weight_decay)
    weight.addcdiv_(state["exp_avg"], denom, value=-lr / bias1)
    p.data.copy_(gh.stochastic_round_to_bf16(weight))


def measure_optimizer(path: str) -> float:
    torch.manual_seed(0)
    p = torch.nn.Parameter((torch.randn(151_936, 1536) * 0.02).bfloat16())
    p.grad = (torch.randn(151_936, 1536) * 1e-3).bfloat16()
    optimizer = gh.build_optimizer([p], lr=1e-6)
    optimizer.step()                                  # moments exist, as from the second step of a run on
    Path("/proc/self/clear_refs").write_text("5")
    base, t0 = rss_mb("VmRSS"), time.perf_counter()
    if path == "adamw-whole":
        whole_tensor_step(p, optimizer.state[p])
    else:
        optimizer.step()
    return rss_mb("VmHWM") - base, time.perf_counter() - t0


def measure(path: str, dtype: str, hidden: int = 1536) -> float:
    """Peak MB added and seconds of one micro-step on `path`; `hidden` narrower than Qwen2.5-1.5B's 1,536 keeps its
    vocabulary, so the logits stay full size while the body shrinks."""
    if path.startswith("adamw"):
        return measure_optimizer(path)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151_936, hidden_size=hidden, intermediate_size=hidden * 35 // 6,
                         num_hidden_layers=2, num_attention_heads=hidden // 128, num_key_value_heads=2,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    ids = torch.randint(0, config.vocab_size, (SEQUENCES, PROMPT + COMPLETION))
    mask = torch.ones_like(ids)
    for p in model.parameters():                      # gradients exist before the measured step, as in training
        p.grad = torch.zeros_like(p)
    score = gh.compute_logprobs_from_model
    if path.startswith("rev:"):           # another revision's grpo_homework.py, imported before the measurement
        import importlib.util
        import tempfile
        source = subprocess.run(["git", "show", f"{path[4:]}:grpo_homework.py"], capture_output=True, text=True,
                                check=True, cwd=Path(__file__).resolve().parents[1]).stdout
        file = Path(tempfile.mkdtemp()) / "grpo_revision.py"
        file.write_text(source)
        spec = importlib.util.spec_from_file_location("grpo_revision", file)
        sys.modules["grpo_revision"] = module = importlib.util.module_from_spec(spec)   # dataclasses look it up
        spec.loader.exec_module(module)
        score = module.compute_logprobs_from_model
    Path("/proc/self/clear_refs").write_text("5")
    base, t0 = rss_mb("VmRSS"), time.perf_counter()
    if path == "body":          # transformer layers and tied-embedding gradient only: what both paths share
        model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, PROMPT:].float().mean().backward()
    else:
        if path == "naive":
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            logprobs = logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
            logprobs = logprobs[:, PROMPT - 1:]
        else:
            logprobs = score(model, ids, mask, prompt_length=PROMPT)[:, PROMPT:]
        logprobs.mean().backward()
    return rss_mb("VmHWM") - base, time.perf_counter() - t0


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] != "--against":          # PATH DTYPE [HIDDEN]: one measurement
        print(*measure(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])))
        sys.exit(0)
    against = [f"rev:{sys.argv[2]}"] if sys.argv[1:2] == ["--against"] else []
    print(f"one micro-step: {SEQUENCES} sequences x ({PROMPT} prompt + {COMPLETION} completion) tokens, "
          f"Qwen2.5-1.5B widths, 2 layers, on CPU; peak memory added over weights and gradients (MB), and seconds")
    paths = ("naive", "ours", "body", *against)
    print(f"{'weights':<10}" + "".join(f"{p:>10}" for p in paths) + f"{'ours-body':>12}{'naive-body':>12}"
          + "".join(f"{p + ' s':>12}" for p in ("naive", "ours", *against)))
    for dtype in ("bfloat16", "float32"):      # bf16 is what the CLI trains in on a GPU; fp32 for comparison
        runs = {path: [float(x) for x in subprocess.run([sys.executable, __file__, path, dtype], capture_output=True,
                                                        text=True, check=True).stdout.split()[-2:]] for path in paths}
        mb = {path: r[0] for path, r in runs.items()}
        print(f"{dtype:<10}" + "".join(f"{mb[p]:>10.0f}" for p in paths) + f"{mb['ours'] - mb['body']:>12.0f}"
              f"{mb['naive'] - mb['body']:>12.0f}" + "".join(f"{runs[p][1]:>12.2f}" for p in ("naive", "ours", *against)))
    logits = SEQUENCES * (COMPLETION + 1) * 151_936
    print(f"for scale: one fp32 copy of the completion's logits is {logits * 4 / 2**20:.0f} MB, bf16 "
          f"{logits * 2 / 2**20:.0f} MB; the pass grows with --micro-batch-size x --max-new-tokens")
    mb = {path: float(subprocess.run([sys.executable, __file__, path, "bfloat16"], capture_output=True, text=True,
                                     check=True).stdout.split()[0]) for path in ("adamw-whole", "adamw-sliced")}
    print(f"\noptimizer step on the 151,936 x 1,536 embedding (bf16 weight and gradient, fp32 moments: "
          f"{151_936 * 1536 * 12 / 2**20:.0f} MB held before the step); memory the step adds, MB")
    print(f"{'whole tensor (before)':<24}{'sliced (now)':>14}{'ratio':>8}")
    print(f"{mb['adamw-whole']:<24.0f}{mb['adamw-sliced']:>14.0f}{mb['adamw-sliced'] / mb['adamw-whole']:>8.3f}")
    print("target: the sliced step adds <= 512 MB")
