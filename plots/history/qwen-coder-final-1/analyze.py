"""Figures of a run folder, from its records alone: python analyze.py RUN_DIR [CURVES_PNG]
Accuracy before/after (right = the reward's answer; strict = right and well-formed), flips and their two-sided sign
test, where gains and losses come from (cut at the token limit or finished), and the per-step table. With
CURVES_PNG, also one figure of the four curves per step: sampled reward, mean length, cut share, policy_kl."""
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
    return metrics


def plot_curves(run, metrics, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    summary = json.loads((Path(run) / "summary.json").read_text())
    steps = [m["step"] for m in metrics]
    panels = (("reward_mean", "mean reward, all samples drawn (dashed: greedy accuracy)"),
              ("completion_len_mean", "mean completion length, tokens"),
              ("truncated_frac", "share of samples cut at the token limit"),
              ("policy_kl", "policy_kl: KL(before || after), nats a token"))
    fig, axes = plt.subplots(2, 2, figsize=(10, 6))
    for ax, (key, title) in zip(axes.flat, panels):
        ax.plot(steps, [m[key] for m in metrics], "o-")
        ax.set(title=title, xlabel="step")
        ax.grid(alpha=0.3)
    for key, color, when in (("accuracy_before", "tab:red", "before"), ("accuracy_after", "tab:green", "after")):
        if key in summary:
            axes[0, 0].axhline(summary[key], color=color, linestyle="--", label=f"{when} {summary[key]:.1%}")
    axes[0, 0].legend()
    axes[1, 1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    recorded = main(sys.argv[1])
    if len(sys.argv) > 2:
        plot_curves(sys.argv[1], recorded, sys.argv[2])
