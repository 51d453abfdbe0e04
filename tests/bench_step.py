"""Per-step seconds on a real model: the previous generation and log-prob paths and today's, side by side.

Previous: generate prefills every row's prompt (8 times per group), and a step whose groups all got equal
rewards still runs forward and backward for an exactly-zero gradient. Today: generation prefills each prompt once
per group (prefill_once), and rows without signal run no pass (micro_batch_rows leaves them out).

Each step samples one rollout as train_grpo does (sampled_rollout) both ways from the same seed, timing each,
then times on today's rollout, from the same weights: the no-grad log-prob pass that the old policy
(--ppo-epochs > 1) and the reference (--kl-coef > 0) use, and the update (update_once); and the update again on a copy of
the rollout with every advantage 0 (a step without signal). The timed update gives every row a random nonzero
advantage, since a step's own rewards may have no spread at all. Weights and optimizer are restored after
every timing, so both paths do the same work.

Where the `trl` package is installed (a benchmark-only dependency, never the project's), TRL's GRPOTrainer then
runs the same model, prompts and settings in the same process (loss_type grpo, beta 0, one update per rollout,
the same micro-batch as gradient accumulation), and its mean seconds per step are printed beside ours.

Not collected by pytest. On the real SmolLM2-135M-Instruct (built by .ci/run) and GSM8K's first prompts:
    python tests/bench_step.py                      # 2 prompts x 8 x 64 tokens, T 1, fp32, the issue's setting
    python tests/bench_step.py --task arithmetic --batch-size 4 --max-new-tokens 40 --temperature 0.7
"""
import argparse
import contextlib
import copy
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402
from conftest import update_once  # noqa: E402  (train_grpo's step 4 on a rollout made here)

SMOLLM2 = os.environ.get("GRPO_SMOLLM2") or str(Path.home() / ".cache/grpo-homework/SmolLM2-135M-Instruct")
GSM8K = Path(__file__).resolve().parents[2] / "shared" / "gsm8k"


def every_row(rollout, cfg):
    """micro_batch_rows less its filter: every row runs, at its share of the loss."""
    rows_all = len(rollout.completions)
    for start in range(0, rows_all, cfg.micro_batch_size):
        rows = torch.arange(start, min(start + cfg.micro_batch_size, rows_all))
        yield rows, rollout.output_ids.shape[1], len(rows) / rows_all


def previous_path():
    """Generation, log-prob pass and update as they were: one prompt per row, and every row runs."""
    return {"prefill_once": lambda *args: {},           # no shared cache: generate() prefills each row itself
            "micro_batch_rows": every_row}


def sampled_rollout(model, tokenizer, batch, cfg, device) -> gh.Rollout:
    """train_grpo's steps 1-3 on one batch: sample, reward, advantages."""
    sample = gh.generate_completions(model, tokenizer, batch["input_ids"].to(device),
                                     batch["attention_mask"].to(device), cfg.max_new_tokens, cfg.temperature,
                                     cfg.group_size, batch_size=cfg.generation_batch_size,
                                     prefill=lambda *args: gh.prefill_once(*args))     # the run's, as patched
    golds = [gold for gold in batch["answer"] for _ in range(cfg.group_size)]
    rewards = gh.compute_reward(sample["completions"], golds, **cfg.reward_options)
    advantages = gh.compute_advantages_grpo(rewards, cfg.group_size, **cfg.advantage_options)
    return gh.Rollout.of(sample, rewards, advantages, cfg)


@contextlib.contextmanager
def patched(patches: dict):
    saved = {name: getattr(gh, name) for name in patches}
    try:
        for name, value in patches.items():
            setattr(gh, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(gh, name, value)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(model, optimizer, rollout, cfg, patches) -> dict:
    """Seconds of each phase on `rollout` with `patches` applied to the module; weights restored after."""
    weights, state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    # Timing needs known signal, not whatever this step's rewards were (SmolLM2 scores 0 on GSM8K): every row
    # gets a nonzero advantage, or none does.
    spread = dataclasses.replace(rollout, advantages=torch.randn(rollout.advantages.shape,
                                                                 generator=torch.Generator().manual_seed(0)))
    silent = dataclasses.replace(rollout, advantages=torch.zeros_like(rollout.advantages))
    try:
        with patched(patches):
            every = dataclasses.replace(rollout, ref_logprobs=rollout.output_ids)   # every row, as for a reference
            chunks = list(gh.micro_batch_rows(every, cfg))
            out = {"log-probs, no grad (old policy / reference)": timed(lambda: gh.rollout_logprobs(model, rollout,
                                                                                                 cfg, chunks)),
               "update, every group with spread": timed(lambda: update_once(model, optimizer, spread, cfg))}
            model.load_state_dict(weights)
            optimizer.load_state_dict(state)
            out["update, no group with spread"] = timed(lambda: update_once(model, optimizer, silent, cfg))
    finally:
        model.load_state_dict(weights)
        optimizer.load_state_dict(state)
    return out


def trl_seconds_per_step(args, problems: list[dict], cfg) -> list[float]:
    """Seconds of each GRPOTrainer step after the first, on the same prompts (chat messages, our system
    instruction) and reward."""
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    task = gh.TASKS[args.task]
    rows = [{"prompt": [{"role": "system", "content": task.instruction}, {"role": "user", "content": p["question"]}],
             "gold": p["answer"]} for p in problems]

    def reward(completions, gold, **_):
        texts = [c[-1]["content"] for c in completions]
        return gh.compute_reward(texts, gold).tolist()

    class StepTimer(transformers.TrainerCallback):
        def __init__(self):
            self.seconds = []

        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.seconds.append(time.perf_counter() - self.t0)

    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model, padding_side="left")
    rows_per_step = args.batch_size * args.group_size
    config = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=args.device == "cpu", bf16=False,
                        per_device_train_batch_size=min(args.micro_batch_size, rows_per_step),
                        gradient_accumulation_steps=max(1, rows_per_step // args.micro_batch_size),
                        num_generations=args.group_size, max_completion_length=args.max_new_tokens,
                        temperature=args.temperature, loss_type="grpo", beta=0.0, num_iterations=1,
                        learning_rate=cfg.learning_rate, max_steps=args.steps + 1, logging_steps=1, report_to="none",
                        save_strategy="no", seed=0, shuffle_dataset=False, gradient_checkpointing=False)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, processing_class=tokenizer,
                          train_dataset=datasets.Dataset.from_list(rows), callbacks=[timer])
    trainer.train()
    return timer.seconds[1:] or timer.seconds       # its first step warms up, as ours does (unless it is the only one)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=SMOLLM2)
    parser.add_argument("--task", default="gsm8k", choices=["gsm8k", "arithmetic"])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after an untimed first; 0: the first "
                        "step alone, timed with its warm-up (a smoke test)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    cfg = dataclasses.replace(gh.RunConfig(), task=args.task, batch_size=args.batch_size, group_size=args.group_size,
                              max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              micro_batch_size=args.micro_batch_size, generation_batch_size=64,
                              learning_rate=1e-6, gradient_checkpointing="off")
    torch.manual_seed(0)
    model, tokenizer = gh.load_model_and_tokenizer(args.model, device, "float32")   # TRL runs beside it in fp32
    dataset = str(GSM8K) if args.task == "gsm8k" else ""
    problems = gh.TaskDataset(f"train[:{(args.steps + 1) * args.batch_size}]", tokenizer, 512, dataset_path=dataset,
                              prompt_style="chat", task=gh.TASKS[args.task])
    loader = torch.utils.data.DataLoader(problems, batch_size=args.batch_size,
                                         collate_fn=lambda b: gh.collate_prompts(b, tokenizer))
    optimizer = gh.build_optimizer(model.parameters(), cfg.learning_rate)
    paths = (("previous", previous_path()), ("today", {}))
    for step, batch in enumerate(loader):           # step 0 warms up (first calls allocate and dispatch)
        if step <= 1:
            totals = {"previous": {}, "today": {}}
        for name, patches in paths:
            torch.manual_seed(step)
            with patched(patches):
                t0 = time.perf_counter()
                rollout = sampled_rollout(model, tokenizer, batch, cfg, device)
                totals[name]["generation"] = totals[name].get("generation", 0.0) + time.perf_counter() - t0
        for name, patches in paths:
            for phase, seconds in measure(model, optimizer, rollout, cfg, patches).items():
                totals[name][phase] = totals[name].get(phase, 0.0) + seconds
        print(f"step {step}: {rollout.output_ids.shape[0]} rows x {rollout.output_ids.shape[1]} tokens "
              f"(prompt {rollout.prompt_length})")
    steps = max(step, 1)
    print(f"\n{args.model} on {device}, {args.task}: {args.batch_size} prompts x {args.group_size} samples x "
          f"{args.max_new_tokens} new tokens, T {args.temperature}, micro-batch {args.micro_batch_size}, "
          f"mean of {steps} steps (seconds)\n")
    rows = [(phase, totals["previous"][phase] / steps, totals["today"][phase] / steps) for phase in totals["today"]]
    for label, key in (("step with spread (generation + update)", "update, every group with spread"),
                       ("step without spread (generation + update)", "update, no group with spread")):
        rows.append((label, *((totals[name]["generation"] + totals[name][key]) / steps for name, _ in paths)))
    print("| phase | previous | today | previous / today |\n|---|---|---|---|")
    for label, before, now in rows:
        print(f"| {label} | {before:.2f} | {now:.2f} | {before / now:.2f}x |")
    try:
        import trl
    except ImportError:
        print("\ntrl is not installed: no GRPOTrainer comparison (pip install trl, for this bench only)")
        return
    seconds = trl_seconds_per_step(args, [{"question": q, "answer": a} for q, a in
                                          zip(problems.questions, problems.answers)], cfg)
    trl_step = sum(seconds) / len(seconds)
    print(f"\nTRL {trl.__version__} GRPOTrainer, same model, prompts and settings: {trl_step:.2f} s per step "
          f"(steps: {', '.join(f'{x:.1f}' for x in seconds)})")
    for label, before, now in rows[-2:]:
        print(f"TRL / today, {label.split(' (')[0]}: {trl_step / now:.2f}x")


if __name__ == "__main__":
    main()
