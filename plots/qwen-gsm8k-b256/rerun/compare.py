"""#64 item 3, figure for figure: the re-run's records (this folder) against the first run's (..), timings aside.
python compare.py prints, per step, each figure of both runs side by side and whether they are equal, then how many
steps agree on each figure, then both evaluations (before and after, test problems 0-199, greedy)."""
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from analyze import flips, rows, table_row  # noqa: E402  (the run folder's reader, not a second copy)

KEYS = ("prompts_drawn", "signal_groups", "reward_mean", "truncated_frac", "completion_len_mean", "policy_kl")


def main():
    first, again = rows(HERE.parent / "metrics.jsonl"), rows(HERE / "metrics.jsonl")
    print("| step | " + " | ".join(f"{k} (first / re-run)" for k in KEYS) + " |\n|" + "---|" * (len(KEYS) + 1))
    equal = dict.fromkeys(KEYS, 0)
    for a, b in zip(first, again):
        cells = []
        for k in KEYS:
            same = a[k] == b[k]
            equal[k] += same
            cells.append(f"{a[k]:.3g} / {b[k]:.3g}" + (" =" if same else ""))
        print(f"| {a['step']} | " + " | ".join(cells) + " |")
    n = min(len(first), len(again))
    print(f"\n{n} steps compared; equal in: " + ", ".join(f"{k} {v}" for k, v in equal.items()))
    for key in ("reward_mean", "truncated_frac", "completion_len_mean", "policy_kl"):
        for name, run in (("first", first), ("re-run", again)):
            head, tail = run[:8], run[n - 8:n]
            print(f"{key} {name}: steps 1-8 mean {sum(m[key] for m in head) / 8:.3g}, "
                  f"steps {n - 7}-{n} mean {sum(m[key] for m in tail) / 8:.3g}")
    for when in ("before", "after"):
        pair = [HERE.parent / f"eval_{when}.jsonl", HERE / f"eval_{when}.jsonl"]
        if all(p.exists() for p in pair):
            a, b = map(rows, pair)
            differ = sum(x["completion"] != y["completion"] for x, y in zip(a, b))
            print(f"\neval_{when}: {table_row('first', a)}\n{' ' * (len(when) + 7)}{table_row('re-run', b)}\n"
                  f"  completions differing: {differ} of {len(a)}; re-run against first: {flips(a, b)[2]}")


if __name__ == "__main__":
    main()
