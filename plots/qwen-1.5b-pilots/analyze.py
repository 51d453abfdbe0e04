"""The pilots' figures from their records alone (notes.md's rule reads them): python analyze.py [FOLDER]
For each pilot: its evaluation before and after at its own budget, on the same 100 validation problems; the 384
pilot's final/ at 512 against the starting model at 512 (the 512 pilot's evaluation before: the same model, problems
and greedy decoding); the free control at each budget against the starting model there; then each pilot's steps.
Rows, flips, sign tests and intervals as ../qwen-gsm8k-b256/analyze.py prints them (its functions, imported)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "qwen-gsm8k-b256"))
from analyze import HEADER, compare, flips, rows, same_problems, table_row  # noqa: E402

STEP_KEYS = ("step", "prompts_drawn", "signal_groups", "reward_mean", "truncated_frac", "completion_len_mean",
             "policy_kl", "gen_seconds", "update_seconds")


def control(folder: Path, budget: int, before):
    """control-BUDGET.json (tests/bench_prompt.py: the starting model told "Be concise.") against before."""
    path = folder / f"control-{budget}.json"
    if not path.is_file():
        return
    recs = json.loads(path.read_text())["greedy"]["boxed-concise"]["records"]
    same_problems(before, recs)
    print(f"\n## free control at {budget}\n{HEADER}\n{table_row('before', before)}\n{table_row('control', recs)}\n"
          f"control against before: {flips(before, recs)[2]}")


def steps(run: Path):
    print(f"\n{run.name}: | " + " | ".join(STEP_KEYS) + " |")
    for m in rows(run / "metrics.jsonl"):
        print("| " + " | ".join(f"{m[k]:.3g}" if isinstance(m.get(k), float) else str(m.get(k, "")) for k in STEP_KEYS)
              + " |")


def main(folder="."):
    folder = Path(folder)
    start_512 = folder / "b512-lora-lr2e-4" / "eval_before.jsonl"
    for budget in (512, 384, 256):
        run = folder / f"b{budget}-lora-lr2e-4"
        if not (run / "eval_before.jsonl").is_file():
            continue
        before = rows(run / "eval_before.jsonl")
        if (run / "eval_after.jsonl").is_file():
            compare(before, rows(run / "eval_after.jsonl"), f"{run.name} at its budget, {budget} tokens")
        at512 = folder / f"{run.name}-at512" / "eval.jsonl"
        if budget != 512 and at512.is_file() and start_512.is_file():
            compare(rows(start_512), rows(at512), f"{run.name}'s final/ at 512 tokens")
        control(folder, budget, before)
        steps(run)


if __name__ == "__main__":
    main(*sys.argv[1:])
