"""The real job's memory and speed with Qwen2.5-1.5B-Instruct's exact shape, randomly initialised (no download).

Weights are not needed to measure memory and speed: a model of Qwen2.5-1.5B's configuration allocates and
computes exactly as the real one. It runs the pipeline's own functions (generate_completions, train_grpo's update (update_once) with
micro-batches, build_optimizer, save_checkpoint) on synthetic prompts of GSM8K's length, in the CLI's precision
(bf16 on CUDA, fp32 on CPU), and prints per config: peak allocated and reserved GPU memory, seconds for
generation and update, generated and update tokens/s, and the decode step against its bandwidth bound (weight
bytes / memory bandwidth, measured with a large copy in the same run). Then greedy generation three ways on the
same prompts four ways: as the pipeline calls `generate` (dynamic KV cache), with a static cache, with a static
cache plus torch.compile, and with continuous batching (`generate_batch`: paged attention, CUDA graphs on a GPU);
tokens/s side by side, and whether all four give identical tokens. Last, continuous batching samples at the
pipeline's temperature and the pipeline scores those samples: the log-probs `generate_batch` reports must agree
with the pipeline scorer's (compute_logprobs_from_model) within the sampler-agreement test's tolerance (2e-4), or its
samples would not be the distribution the loss assumes.

A random model almost never samples EOS, so every completion runs to --max-new-tokens: the worst case.

Not collected by pytest (the name does not start with test_). Run on a GPU:
    python tests/bench_gpu.py                                   # the CLI's defaults
    python tests/bench_gpu.py --max-new-tokens 1024 --micro-batch-size 8 --skip-compile
    python tests/bench_gpu.py --lora-rank 16 --batch-size 8 --max-new-tokens 1024 --micro-batch-size 8 \
        --generation-batch-size 128 --skip-compile     # README's 24 GB LoRA row
On CPU (a smoke test, not a timing): python tests/bench_gpu.py --layers 1 --hidden-size 96 --max-new-tokens 8
"""
import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402
from conftest import update_once  # noqa: E402  (train_grpo's step 4 on a rollout made here)


def no_grad_eval(model):
    """Eval mode and no gradient, as the run scores and generates."""
    model.eval()
    return torch.no_grad()


QWEN25_15B = dict(vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6,
                  max_position_embeddings=32_768)
EOS, PAD = 151_645, 151_643            # <|im_end|> and <|endoftext|>, as Qwen2.5-Instruct declares them
AGREEMENT_ATOL = 2e-4                  # tests/test_real_model.py: the sampler's log-probs vs the scorer's


class SyntheticTokenizer:
    """What rollout, update and checkpointing ask of a tokenizer, for ids of Qwen's vocabulary."""
    eos_token_id, pad_token_id = EOS, PAD

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))

    def save_pretrained(self, path):
        pass


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_model(layers: int, device: torch.device, hidden: int = QWEN25_15B["hidden_size"], fp32: bool = False):
    """Qwen2.5-1.5B's shape at `layers` deep; a smaller `hidden` (the FFN scaled alike) only for a smoke test.
    fp32: float32 weights on a GPU too (what --dtype auto gives a T4 or V100, which lack bf16)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" and not fp32 else torch.float32   # the CLI's --dtype auto
    shape = {**QWEN25_15B, "num_hidden_layers": layers, "hidden_size": hidden,
             "intermediate_size": QWEN25_15B["intermediate_size"] * hidden // QWEN25_15B["hidden_size"]}
    model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(device, dtype)
    model.generation_config = GenerationConfig(eos_token_id=[EOS, PAD], pad_token_id=PAD)
    return model


def memory_bandwidth(device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    x = torch.empty(2**28 if device.type == "cuda" else 2**26, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(device)
    return 2 * x.numel() * 10 / (time.perf_counter() - t0)


def synthetic_batch(cfg, prompt_tokens: int, device) -> dict:
    ids = torch.randint(0, 150_000, (cfg.batch_size, prompt_tokens), device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def training_steps(model, cfg: gh.RunConfig, steps: int, prompt_tokens: int, device, first_tokens: int = 0) -> dict:
    """Rollout + update per step, as train_grpo runs them, with random rewards so every group has signal.
    first_tokens: the untimed first step generates only this many (its optimizer step allocates the moments, so
    the second step's peak is a run's, at a fraction of a long first generation's seconds)."""
    tokenizer = SyntheticTokenizer()
    optimizer = gh.build_optimizer([p for p in model.parameters() if p.requires_grad], cfg.learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    gen_s = update_s = 0.0
    new_tokens = update_tokens = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(steps):
        batch = synthetic_batch(cfg, prompt_tokens, device)
        sync(device)
        t0 = time.perf_counter()
        sample = gh.generate_completions(model, tokenizer, batch["input_ids"], batch["attention_mask"],
                                         first_tokens if first_tokens and not step else cfg.max_new_tokens,
                                         cfg.temperature, cfg.group_size,
                                         batch_size=cfg.generation_batch_size)
        sync(device)
        t1 = time.perf_counter()
        rewards = (torch.rand(sample["output_ids"].shape[0]) < 0.5).float()
        rollout = gh.Rollout(sample["output_ids"], sample["attention_mask"], sample["completion_mask"].bool(),
                             sample["prompt_length"], sample["completions"], rewards,
                             gh.compute_advantages_grpo(rewards, cfg.group_size), sample["truncated"].cpu(),
                             sample["completion_lengths"].cpu())
        update_once(model, optimizer, rollout, cfg)
        sync(device)
        t2 = time.perf_counter()
        peak = f", peak allocated {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device.type == "cuda" else ""
        print(f"  step {step}: {int(sample['completion_lengths'].max())} new tokens, generation {t1 - t0:.1f} s, "
              f"update {t2 - t1:.1f} s{peak}", flush=True)
        if step:                    # the first step pays for allocator warm-up and kernel selection
            gen_s, update_s = gen_s + t1 - t0, update_s + t2 - t1
            new_tokens += int(sample["completion_lengths"].sum())
            update_tokens += int(rollout.attention_mask.sum())
    timed = max(steps - 1, 1)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        gh.save_checkpoint(Path(tmp), model, tokenizer, optimizer, scheduler,
                           {"step": steps, "epoch": 0, "batch_in_epoch": steps})
        checkpoint_s = time.perf_counter() - t0
    out = {"gen_s": gen_s / timed, "update_s": update_s / timed, "gen_tok_s": new_tokens / max(gen_s, 1e-9),
           "update_tok_s": update_tokens / max(update_s, 1e-9), "checkpoint_s": checkpoint_s,
           "decode_step_ms": 1e3 * gen_s / timed / (cfg.max_new_tokens *
                                                    -(-cfg.batch_size * cfg.group_size // cfg.generation_batch_size))}
    if device.type == "cuda":
        out.update(peak_alloc_gb=torch.cuda.max_memory_allocated() / 2**30,
                   peak_reserved_gb=torch.cuda.max_memory_reserved() / 2**30)
    return out


def continuous_batching(model, rows: torch.Tensor, config) -> tuple[torch.Tensor, list[list[float]], float]:
    """Continuous batching on unpadded prompts: new tokens [rows, new] (PAD after an early EOS), their log-probs,
    and the seconds from submitting the prompts to the last result. What `generate_batch` does, with the
    manager's start and its stop (which waits up to 5 s for its thread) left out of the time."""
    from transformers import ContinuousBatchingConfig
    # On a GPU the paged cache takes what memory is free, as in a real run; on a CPU (the smoke test) that would be
    # a share of all RAM, gigabytes to zero-fill, so there it holds just these rows.
    size = {} if rows.is_cuda else {"num_blocks": len(rows) * (1 + (rows.shape[1] + config.max_new_tokens) // 256)}
    with no_grad_eval(model), model.continuous_batching_context_manager(
            generation_config=config, block=False,
            continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True, **size)) as manager:
        sync(rows.device)
        t0 = time.perf_counter()
        ids = manager.add_requests(inputs=rows.tolist(), max_new_tokens=config.max_new_tokens)
        results = {}
        while len(results) < len(ids):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                results[result.request_id] = result
        seconds = time.perf_counter() - t0
    ordered = [results[i] for i in ids]
    width = max(len(o.generated_tokens) for o in ordered)
    tokens = torch.tensor([o.generated_tokens + [PAD] * (width - len(o.generated_tokens)) for o in ordered])
    return tokens.to(rows.device), [o.logprobs for o in ordered], seconds


def generation_four_ways(model, cfg: gh.RunConfig, prompt_tokens: int, device) -> dict:
    """Greedy tokens/s: the pipeline's generate call, a static KV cache, a static cache + torch.compile, and
    continuous batching; then whether continuous batching samples the distribution the pipeline scores."""
    from transformers import CompileConfig
    batch = synthetic_batch(cfg, prompt_tokens, device)
    rows = batch["input_ids"].repeat_interleave(cfg.group_size, 0)
    mask = torch.ones_like(rows)
    tokenizer = SyntheticTokenizer()
    config = gh.sampling_config(0.0, cfg.max_new_tokens, [EOS, PAD], PAD)
    compile_everywhere = CompileConfig()
    compile_everywhere._compile_all_devices = True        # transformers compiles only on accelerators otherwise
    ways = {"pipeline (dynamic cache)": None,
            "static cache": dict(cache_implementation="static", disable_compile=True),
            "static cache + compile": dict(cache_implementation="static", compile_config=compile_everywhere),
            "continuous batching": "generate_batch"}
    results, tokens = {}, {}
    for name, extra in ways.items():
        for attempt in range(2):               # the second call is timed: compilation and warm-up are not
            sync(device)
            t0 = time.perf_counter()
            if extra is None:
                out = gh.generate_completions(model, tokenizer, rows, mask, cfg.max_new_tokens, temperature=0.0,
                                              num_samples=1)["output_ids"][:, rows.shape[1]:]
            elif extra == "generate_batch":
                out, _, cb_seconds = continuous_batching(model, rows, config)
            else:
                way = copy.deepcopy(config)
                for key, value in extra.items():
                    setattr(way, key, value)
                with no_grad_eval(model):
                    out = model.generate(input_ids=rows, attention_mask=mask, generation_config=way)[:, rows.shape[1]:]
            sync(device)
            seconds = cb_seconds if extra == "generate_batch" else time.perf_counter() - t0
        tokens[name] = out
        results[name] = out.numel() / seconds
        print(f"  {name}: {results[name]:.0f} new tok/s", flush=True)     # a way that hangs leaves the others
    first = next(iter(tokens.values()))
    identical = {name: t.shape == first.shape and torch.equal(t, first) for name, t in tokens.items()}

    sampling = gh.sampling_config(cfg.temperature, cfg.max_new_tokens, [EOS, PAD], PAD)
    new, reported, _ = continuous_batching(model, rows, sampling)
    full = torch.cat([rows, new], 1)
    with no_grad_eval(model):
        scored = gh.compute_logprobs_from_model(model, full, torch.ones_like(full), temperature=cfg.temperature,
                                                prompt_length=rows.shape[1])[:, rows.shape[1]:]
    gaps = [abs(float(scored[r, t]) - lp) for r, lps in enumerate(reported) for t, lp in enumerate(lps)]
    return {"tok_s": results, "identical": identical, "logprob_gap": max(gaps, default=float("nan"))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=QWEN25_15B["num_hidden_layers"], help="28 = the real depth")
    parser.add_argument("--hidden-size", type=int, default=QWEN25_15B["hidden_size"],
                        help="1536 = the real width; smaller (a multiple of 12 heads x 2) only for a CPU smoke test")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per config; the first is not timed")
    parser.add_argument("--prompt-tokens", type=int, default=100, help="GSM8K's chat prompts are about 100 tokens")
    parser.add_argument("--skip-compile", action="store_true", help="leave out the four-way generation comparison")
    parser.add_argument("--fp32", action="store_true", help="float32 weights on a GPU too: a T4's or V100's rows")
    parser.add_argument("--first-step-tokens", type=int, default=0,
                        help="new tokens of the untimed first step (0 = --max-new-tokens): a cheaper warm-up")
    sizes = ("batch_size", "group_size", "max_new_tokens", "micro_batch_size", "generation_batch_size", "lora_rank")
    for name in sizes:
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(gh.RunConfig, name))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cfg = gh.RunConfig(**{k: getattr(args, k) for k in sizes})
    gh.validate_config(cfg)
    model = build_model(args.layers, device, args.hidden_size, args.fp32)
    if cfg.lora_rank:                         # the CLI's --lora-rank: peft adapters (fp32) on the bf16 body
        model = gh.with_lora(model, cfg, None)
    if device.type == "cuda":
        gh.enable_checkpointing(model)        # the CLI's --gradient-checkpointing auto
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = memory_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    width = "" if args.hidden_size == QWEN25_15B["hidden_size"] else f", width {args.hidden_size}"
    print(f"{name}: Qwen2.5-1.5B shape, {args.layers} layers{width}, {weight_bytes / 2**30:.2f} GiB of weights "
          f"({next(model.parameters()).dtype}); copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"config: {f'LoRA {cfg.lora_rank}' if cfg.lora_rank else 'full'}, {cfg.batch_size} prompts x "
          f"{cfg.group_size} samples x {cfg.max_new_tokens} new tokens, "
          f"prompt {args.prompt_tokens} tokens, micro-batch {cfg.micro_batch_size}, generation batch "
          f"{cfg.generation_batch_size}")
    r = training_steps(model, cfg, args.steps, args.prompt_tokens, device, args.first_step_tokens)
    bound_ms = 1e3 * weight_bytes / bandwidth
    memory = (f"peak allocated {r['peak_alloc_gb']:.1f} GiB, reserved {r['peak_reserved_gb']:.1f} GiB"
              if "peak_alloc_gb" in r else "peak GPU memory n/a on CPU")
    print(f"step: generation {r['gen_s']:.2f} s ({r['gen_tok_s']:.0f} new tok/s), update {r['update_s']:.2f} s "
          f"({r['update_tok_s']:.0f} tok/s), checkpoint {r['checkpoint_s']:.1f} s; {memory}")
    print(f"decode step {r['decode_step_ms']:.2f} ms vs bandwidth bound {bound_ms:.2f} ms "
          f"({bound_ms / r['decode_step_ms']:.0%} of the bound)")
    if args.skip_compile:
        return
    g = generation_four_ways(model, cfg, args.prompt_tokens, device)
    print("greedy generation, new tokens/s: " + ", ".join(f"{k} {v:.0f}" for k, v in g["tok_s"].items()) +
          f"; identical tokens: {all(g['identical'].values())}" +
          "".join(f" ({k} differs)" for k, same in g["identical"].items() if not same))
    gap = g["logprob_gap"]
    print(f"continuous batching sampled at temperature {cfg.temperature}: its log-probs vs the pipeline's, max "
          f"|difference| {gap:.1e}; agree within {AGREEMENT_ATOL:.0e}: {gap <= AGREEMENT_ATOL}")


if __name__ == "__main__":
    main()
