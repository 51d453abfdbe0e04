"""Figures of a run folder, from its records alone: python analyze.py RUN_DIR
Accuracy before/after (right = the reward's answer; strict = right and well-formed), flips and their two-sided sign
test, where gains and losses come from (cut at the token limit or finished), and the per-step table."""
import json
import math
import sys
from pathlib import Path


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sign_test(gained, lost):
    n, k = gained + lost, min(gained, lost)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def main(run):
    run = Path(run)
    if (run / "eval_before.jsonl").exists() and (run / "eval_after.jsonl").exists():
        before, after = rows(run / "eval_before.jsonl"), rows(run / "eval_after.jsonl")
        assert [b["question"] for b in before] == [a["question"] for a in after]
        n = len(before)
        for name, recs in (("before", before), ("after", after)):
            right = sum(r["correct"] for r in recs)
            strict = sum(r["correct"] and r["well_formed"] for r in recs)
            done = [r for r in recs if not r["truncated"]]
            print(f"{name}: right {right}/{n} ({100 * right / n:.1f}%), strict {strict}/{n}, "
                  f"well-formed {sum(r['well_formed'] for r in recs)}/{n}, cut {n - len(done)}/{n}, "
                  f"right of finished {sum(r['correct'] for r in done)}/{len(done)}")
        gained = [i for i in range(n) if after[i]["correct"] and not before[i]["correct"]]
        lost = [i for i in range(n) if before[i]["correct"] and not after[i]["correct"]]
        print(f"gained {len(gained)}, lost {len(lost)}, sign-test p = {sign_test(len(gained), len(lost)):.3g}")
        print(f"gains cut before: {sum(before[i]['truncated'] for i in gained)} (others finished wrong); "
              f"losses cut after: {sum(after[i]['truncated'] for i in lost)}")
        print("gained records:", gained, "\nlost records:", lost)
    keys = ("step", "prompts_drawn", "signal_groups", "reward_mean", "truncated_frac", "completion_len_mean",
            "policy_kl", "entropy", "gen_seconds", "update_seconds")
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    metrics = rows(run / "metrics.jsonl")
    for m in metrics:
        print("| " + " | ".join(f"{m.get(k, ''):.3g}" if isinstance(m.get(k), float) else str(m.get(k, ""))
                                for k in keys) + " |")
    gen, upd = sum(m["gen_seconds"] for m in metrics), sum(m["update_seconds"] for m in metrics)
    print(f"\n{len(metrics)} steps: generation {gen / 60:.0f} min, update {upd / 60:.0f} min")


if __name__ == "__main__":
    main(sys.argv[1])
