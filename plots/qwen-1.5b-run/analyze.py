"""The 1.5B run's figures from its records alone (plan.md): python analyze.py [FOLDER]
Test problems 200-599, scored in chunks of 100 (before-T/START/eval.jsonl, after-T/START/eval.jsonl, the free control
control-T/START.json), joined in order: for each budget T the before/after rows with flips, the sign test and the
paired 95% interval, and the control against both; then the 0.5B's records on the same 400 problems (a subset of
../qwen-gsm8k-b256/'s 1,119, for comparison only); then the run's steps, the restart against run-attempt1/
step by step (all but timings), and its own evaluations on validation. Since plan.md's addendum of 2026-11-28 a
budget's chunks may come from two trainings of the recipe (run/final, run-b/final, named in each chunk's
config.json): each one's problems are then compared apart before the joined 400, and run-b's steps against run/'s;
beside the test, run-b/final's scores of 200-399 (after-b-512/) against run/final's on the same problems.
Rows, flips and tests as ../qwen-gsm8k-b256/analyze.py prints them (its functions, imported)."""
import json
import sys
from pathlib import Path

B256 = Path(__file__).resolve().parents[1] / "qwen-gsm8k-b256"
sys.path.insert(0, str(B256))
from analyze import HEADER, compare, flips, rows, same_problems, table_row  # noqa: E402

CHUNKS = (200, 300, 400, 500)


def joined(folder: Path, who: str, tokens: int, starts=CHUNKS):
    """The records of one model at one budget, chunk after chunk (all 400 by default); None until every chunk is
    there."""
    parts = [folder / f"{who}-{tokens}" / str(start) / "eval.jsonl" for start in starts]
    return [r for p in parts for r in rows(p)] if all(p.is_file() for p in parts) else None


def trained_models(folder: Path, tokens: int):
    """Which final/ scored each chunk of the trained model at one budget: run/final or run-b/final (plan.md)."""
    configs = [json.loads((folder / f"after-{tokens}" / str(start) / "config.json").read_text()) for start in CHUNKS]
    return ["/".join(Path(c["config"]["model_path"]).parts[-2:]) for c in configs]


def control(folder: Path, tokens: int):
    parts = [folder / f"control-{tokens}" / f"{start}.json" for start in CHUNKS]
    if not all(p.is_file() for p in parts):
        return None
    return [r for p in parts for r in json.loads(p.read_text())["greedy"]["boxed-concise"]["records"]]


def main(folder="."):
    folder = Path(folder)
    budgets = sorted({int(p.name.split("-")[1]) for p in folder.glob("before-*") if p.is_dir()})
    for tokens in budgets:
        before, after, free = joined(folder, "before", tokens), joined(folder, "after", tokens), control(folder, tokens)
        if before and after:
            scored_by = trained_models(folder, tokens)
            trainings = list(dict.fromkeys(scored_by))   # in chunk order
            for model in trainings if len(trainings) > 1 else ():
                chunks = [c for c, m in enumerate(scored_by) if m == model]
                part = [j for c in chunks for j in range(100 * c, 100 * c + 100)]   # indices into the 400
                compare([before[j] for j in part], [after[j] for j in part], f"{tokens} new tokens, the chunks "
                        f"{model} scored: test problems " + ", ".join(f"{CHUNKS[c]}-{CHUNKS[c] + 99}" for c in chunks))
            compare(before, after, f"Qwen2.5-Coder-1.5B at {tokens} new tokens, test problems 200-599 (plan.md)"
                    + (", two trainings of the recipe joined" if len(trainings) > 1 else ""))
        elif before:
            print(f"\n## {tokens} new tokens: before only\n{HEADER}\n{table_row('before', before)}")
        if before and free:
            same_problems(before, free)
            print(f"{table_row('control', free)}\ncontrol against before: {flips(before, free)[2]}"
                  + (f"; trained against control: {flips(free, after)[2]}" if after else ""))
    # Beside, outside the test (plan.md, added 2026-11-28): the second training's final/ on the first's problems
    # (the chunks scored so far: a sitting's end may leave the second undone)
    starts = [s for s in CHUNKS[:2] if (folder / "after-b-512" / str(s) / "eval.jsonl").is_file()]
    first, second = (joined(folder, who, 512, starts) for who in ("after", "after-b"))
    if first and second:
        same_problems(first, second)
        same = sum(a["completion"] == b["completion"] for a, b in zip(first, second))
        print("\n## beside the test: the two trainings' final/ at 512 tokens, test problems "
              + ", ".join(f"{s}-{s + 99}" for s in starts) + f"\n{HEADER}\n"
              f"{table_row('run/final', first)}\n{table_row('run-b/final', second)}\nthe same completion, "
              f"character for character, on {same} of {len(first)}; run-b against run: {flips(first, second)[2]}")
    for tokens in (256, 512):          # the 0.5B on the same problems: the first 400 of its 1,119 (200-1318)
        pair = [B256 / f"eval_{who}_untouched_{tokens}.jsonl" for who in ("before", "after")]
        if all(p.is_file() for p in pair):
            compare(*(rows(p)[:400] for p in pair), f"Qwen2.5-Coder-0.5B (../qwen-gsm8k-b256/) at {tokens} tokens, "
                    f"the same 400 problems (a subset of its test, for comparison only)")
    keys = ("step", "prompts_drawn", "signal_groups", "reward_mean", "truncated_frac", "completion_len_mean",
            "policy_kl", "entropy", "gen_seconds", "update_seconds")
    timing = {"gen_seconds", "update_seconds", "tokens_per_s"}
    # each training against the one before it: the restart against the attempt whose checkpoints were lost, the
    # second training (plan.md, added 2026-11-28) against the first
    for name, earlier in (("run", "run-attempt1"), ("run-b", "run")):
        run, first = folder / name / "metrics.jsonl", folder / earlier / "metrics.jsonl"
        if not run.is_file():
            continue
        print(f"\n{name}/'s steps\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
        for m in rows(run):
            print("| " + " | ".join(f"{m.get(k, ''):.3g}" if isinstance(m.get(k), float) else str(m.get(k, ""))
                                    for k in keys) + " |")
        if first.is_file():
            again = {m["step"]: m for m in rows(run)}
            both = [(m, again[m["step"]]) for m in rows(first) if m["step"] in again]
            differ = [a["step"] for a, b in both if {k: v for k, v in a.items() if k not in timing}
                      != {k: v for k, v in b.items() if k not in timing}]
            print(f"\n{name}/ against {earlier}/, steps 1-{len(both)}: every figure but the timings equal "
                  f"in {len(both) - len(differ)} steps" + (f"; steps {differ} differ" if differ else ""))
            for a, b in both:   # how far: a sampling that parted shows in reward and lengths, rounding only in KL
                apart = {k: abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k])) for k in a if k not in timing
                         if isinstance(a[k], (int, float)) and k in b and a[k] != b[k]}
                if apart:
                    print(f"  step {a['step']}: " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(
                        apart.items(), key=lambda kv: -kv[1])) + " (relative difference)")
        if (folder / name / "eval_after.jsonl").is_file():
            own = rows(folder / name / "eval_before.jsonl"), rows(folder / name / "eval_after.jsonl")
            compare(*own, f"{name}/'s own evaluations, {len(own[0])} validation problems (not the test)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
