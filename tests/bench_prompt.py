"""Which instruction gives a real Qwen2.5 instruct model a GRPO run with signal: figures side by side, one run.

For each instruction (the '####' one GSM8K's answers use, and the one Qwen2.5 models are trained with, "Please
reason step by step, and put your final answer within \\boxed{}."), on the same GSM8K test problems:
greedy accuracy, lenient (the number after any answer marker) and strict (right and in the well-formed final
form), format rate, truncation and mean length, through the pipeline's own evaluate(); then, on the first
training problems, G samples per problem at each temperature as train_grpo samples them: mean reward, truncation,
and the share of groups with reward spread (GRPO learns nothing from a group whose rewards are all equal).

Not collected by pytest; needs GSM8K (../shared/gsm8k or --dataset) and a Qwen2.5 instruct model folder:
    python tests/bench_prompt.py MODEL_DIR --out prompt.json    # 100 test problems, 320 tokens, T 0.7 and 1
    python tests/bench_prompt.py --rescore prompt.json          # the tables again, read by today's reward
    python tests/bench_prompt.py MODEL_DIR --split train --problems 200 --groups 0 --instructions boxed boxed-concise
                                   # the validation problems (--val-size 200) instead of the test set
    python tests/bench_prompt.py MODEL_DIR --start 200 --problems 400 ...   # test problems 200-599
Every completion goes to --out (JSON), with each phase's figures as soon as it ends.
"""
import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402
from bench_step import sampled_rollout  # noqa: E402

# "boxed-concise" is #44's free control: how much of a gain a prompt alone would give (answers are cut at 320 tokens)
INSTRUCTIONS = {"####": gh.HASH_INSTRUCTION, "boxed": gh.GSM8K_INSTRUCTION,
                "boxed-concise": gh.GSM8K_INSTRUCTION + " Be concise."}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--rescore", metavar="JSON", help="print the tables of a saved --out, every completion read "
                        "again by today's extract_answer_from_completion and final_line_answer")
    parser.add_argument("--dataset", default=str(Path(__file__).resolve().parents[2] / "shared" / "gsm8k"))
    parser.add_argument("--problems", type=int, default=100, help="problems answered greedily")
    parser.add_argument("--start", type=int, default=0, help="the position of the first of them in the split "
                        "(as the pipeline's --eval-start)")
    parser.add_argument("--split", default="test", choices=["test", "train"], help="train: its first --problems, the "
                        "validation set of --val-size")
    parser.add_argument("--instructions", nargs="+", default=["####", "boxed"], choices=list(INSTRUCTIONS))
    parser.add_argument("--max-new-tokens", type=int, default=320)
    parser.add_argument("--groups", type=int, default=4, help="training problems sampled per temperature")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--eval-batch-size", type=int, default=50)
    parser.add_argument("--out", default="prompt.json")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="float32: as the "
                        "committed records were measured; bfloat16: as --dtype auto runs on a CPU with AVX512-BF16")
    args = parser.parse_args()
    if args.rescore:
        print_tables(rescored(json.loads(Path(args.rescore).read_text())))
        return
    torch.set_grad_enabled(False)
    model, tokenizer = gh.load_model_and_tokenizer(args.model, torch.device("cpu"), args.dtype)
    cfg = gh.RunConfig(max_new_tokens=args.max_new_tokens, eval_batch_size=args.eval_batch_size,
                    group_size=args.group_size, generation_batch_size=args.groups * args.group_size)
    results = {"model": args.model, "settings": vars(args), "greedy": {}, "sampled": {}}
    chosen = {name: INSTRUCTIONS[name] for name in args.instructions}
    for name, instruction in chosen.items():
        task = dataclasses.replace(gh.TASKS["gsm8k"], instruction=instruction)
        problems = f"{args.split}[{args.start}:{args.start + args.problems}]"
        data = gh.TaskDataset(problems, tokenizer, 512, dataset_path=args.dataset, prompt_style="chat", task=task)
        t0 = time.perf_counter()
        _, records = gh.evaluate(model, tokenizer, data, cfg, torch.device("cpu"), desc=f"greedy {name}")
        n = len(records)
        results["greedy"][name] = {
            "lenient": sum(r["correct"] for r in records) / n,
            "strict": sum(r["correct"] and r["well_formed"] for r in records) / n,
            "format_rate": sum(r["well_formed"] for r in records) / n,
            "truncated": sum(r["truncated"] for r in records) / n,
            "mean_tokens": sum(r["tokens"] for r in records) / n,
            "seconds_per_problem": (time.perf_counter() - t0) / n, "records": records}
        Path(args.out).write_text(json.dumps(results, indent=1))
    for name, instruction in chosen.items() if args.groups else ():
        task = dataclasses.replace(gh.TASKS["gsm8k"], instruction=instruction)
        data = gh.TaskDataset(f"train[:{args.groups}]", tokenizer, 512, dataset_path=args.dataset,
                              prompt_style="chat", task=task)
        batch = gh.collate_prompts([data[i] for i in range(len(data))], tokenizer)
        for temperature in args.temperatures:
            torch.manual_seed(0)
            t0 = time.perf_counter()
            rollout = sampled_rollout(model, tokenizer, batch, dataclasses.replace(cfg, temperature=temperature),
                                      torch.device("cpu"))
            groups = rollout.rewards.view(-1, args.group_size)
            results["sampled"][f"{name} T{temperature}"] = {
                "reward_mean": rollout.rewards.mean().item(),
                "groups_with_spread": (groups.max(1).values > groups.min(1).values).float().mean().item(),
                "truncated": rollout.truncated.float().mean().item(),
                "mean_tokens": rollout.completion_lengths.float().mean().item(),
                "seconds_per_sample": (time.perf_counter() - t0) / len(rollout.completions),
                "completions": rollout.completions, "rewards": rollout.rewards.tolist(), "golds": batch["answer"]}
            Path(args.out).write_text(json.dumps(results, indent=1))
    print_tables(results)


def rescored(results: dict) -> dict:
    """`results` with every greedy record's correct and well_formed, and every sampled reward, read again."""
    for row in results["greedy"].values():
        for r in row["records"]:
            r.update(correct=gh.compute_reward([r["completion"]], [r["gold"]]).item() == 1.0,
                     well_formed=(gh.final_line_answer(r["completion"]) is not None))
        n = len(row["records"])
        row.update(lenient=sum(r["correct"] for r in row["records"]) / n,
                   strict=sum(r["correct"] and r["well_formed"] for r in row["records"]) / n,
                   format_rate=sum(r["well_formed"] for r in row["records"]) / n)
    for row in results["sampled"].values():
        golds = [g for g in row["golds"] for _ in range(len(row["rewards"]) // len(row["golds"]))]
        rewards = gh.compute_reward(row["completions"], golds)
        row["reward_mean"] = rewards.mean().item()
        groups = rewards.view(len(row["golds"]), -1)
        row["groups_with_spread"] = (groups.max(1).values > groups.min(1).values).float().mean().item()
    return results


def print_tables(results: dict) -> None:
    args = argparse.Namespace(**results["settings"])
    split = getattr(args, "split", "test")                    # files written before --split had the test set
    first = f" from {args.start}" if getattr(args, "start", 0) else ""      # files written before --start began at 0
    print(f"{f'greedy, {args.problems} {split} problems{first}':<34}{'lenient':>9}{'strict':>9}{'format':>9}"
          f"{'cut':>7}{'tokens':>8}{'s/problem':>11}")
    for name, r in results["greedy"].items():
        print(f"{name:<34}{r['lenient']:>9.1%}{r['strict']:>9.1%}{r['format_rate']:>9.1%}{r['truncated']:>7.0%}"
              f"{r['mean_tokens']:>8.0f}{r['seconds_per_problem']:>11.1f}")
    print(f"\n{f'sampled, {args.groups} x {args.group_size}':<34}{'reward':>9}{'spread':>9}{'cut':>7}{'tokens':>8}"
          f"{'s/sample':>11}")
    for name, r in results["sampled"].items():
        print(f"{name:<34}{r['reward_mean']:>9.3f}{r['groups_with_spread']:>9.0%}{r['truncated']:>7.0%}"
              f"{r['mean_tokens']:>8.0f}{r['seconds_per_sample']:>11.1f}")


if __name__ == "__main__":
    main()
