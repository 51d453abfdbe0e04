"""Figures of the GSM8K run, from its records alone: python analyze.py [RUN_DIR] [CURVES_PNG [RUN[=LABEL] ...]]
For each pair of evaluations of the same problems (eval_before/after.jsonl at the training budget and the *_512
pair at 512 tokens, on test problems 0-199; the *_untouched_256 and *_untouched_512 pairs on test problems
200-1318, plan.md), the report's row: accuracy (right = the reward's reader; strict = right and in a well-formed
final line), flips with their two-sided exact sign test and the paired 95% interval of the difference, cut share,
mean length, right of the finished; the free
control's row (control-test-256.json) beside the first pair; then the per-step table. With CURVES_PNG, one
figure of four curves per step: sampled reward, length, cut share, policy_kl, for each RUN (a folder, named LABEL
in the legend) in turn; RUN_DIR's records are printed."""
import json
import math
import sys
from pathlib import Path


def rows(path):
    """A JSON-lines record's rows; a torn last line (a process stopped mid-write) is dropped with a warning."""
    if not path.is_file():
        print(f"analyze.py: {path} does not exist", file=sys.stderr)
        sys.exit(2)
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except ValueError:
            if i < len(lines) - 1:
                print(f"analyze.py: {path} line {i + 1} is not JSON", file=sys.stderr)
                sys.exit(2)
            print(f"warning: {path}: ignoring a half-written last line", file=sys.stderr)
    return out


def sign_test(gained, lost):
    n, k = gained + lost, min(gained, lost)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


HEADER = "| | right (lenient) | strict | well-formed | cut | mean tokens | right of finished |\n|" + "---|" * 7
LENIENT, STRICT = (lambda r: r["correct"]), (lambda r: r["correct"] and r["well_formed"])


def table_row(name, recs):
    done, right, n = [r for r in recs if not r["truncated"]], sum(r["correct"] for r in recs), len(recs)
    return (f"| {name} | {right} ({100 * right / n:.1f}%) | {sum(map(STRICT, recs))} | "
            f"{sum(r['well_formed'] for r in recs)} | {n - len(done)} | {sum(r['tokens'] for r in recs) / n:.0f} | "
            f"{sum(r['correct'] for r in done)} of {len(done)} |")


def flips(base, other, ok=LENIENT):
    """Indices right in other and not in base (gained), and the reverse (lost), with the sign test's line."""
    gained = [i for i, (b, o) in enumerate(zip(base, other)) if ok(o) and not ok(b)]
    lost = [i for i, (b, o) in enumerate(zip(base, other)) if ok(b) and not ok(o)]
    return gained, lost, f"gained {len(gained)}, lost {len(lost)}, sign test p = {sign_test(len(gained), len(lost)):.3g}"


def same_problems(*evaluations):
    if not all(evaluations) or not all([r["question"] for r in e] == [r["question"] for r in evaluations[0]]
                                       for e in evaluations):
        print("analyze.py: a pair of evaluations is empty or holds other problems", file=sys.stderr)
        sys.exit(2)


def control_file(run):
    """The free control's record: the run's own, else its parent's (the re-run, rerun/, shares the first run's)."""
    return next((p for p in (run / "control-test-256.json", run.parent / "control-test-256.json") if p.exists()), None)


def control_row(run, before, after):
    """The free control (control.sh: the starting model told "Be concise.", no training) on the same problems."""
    recs = json.loads(control_file(run).read_text())["greedy"]["boxed-concise"]["records"]
    same_problems(before, recs)
    print(f"\n{HEADER}\n{table_row('control', recs)}\ncontrol against before: {flips(before, recs)[2]}; "
          f"trained against control: {flips(recs, after)[2]}")


def compare(before, after, label):
    same_problems(before, after)
    print(f"\n## {label}: {len(before)} problems, greedy\n{HEADER}")
    for name, recs in (("before", before), ("after", after)):
        print(table_row(name, recs))
    for kind, ok in (("lenient", LENIENT), ("strict", STRICT)):
        gained, lost, line = flips(before, after, ok)
        n, diff = len(before), (len(gained) - len(lost)) / len(before)
        half = 1.96 * math.sqrt(max((len(gained) + len(lost)) / n - diff ** 2, 0) / n)    # paired normal interval
        print(f"{kind}: {line}; difference {100 * diff:+.1f} points (95% interval {100 * (diff - half):+.1f} to "
              f"{100 * (diff + half):+.1f})")
        if kind == "lenient":
            print(f"  gains cut before: {sum(before[i]['truncated'] for i in gained)} (the others finished wrong); "
                  f"losses cut after: {sum(after[i]['truncated'] for i in lost)}\n  gained records: {gained}\n"
                  f"  lost records: {lost}")


LABELS = {"": "at the training budget, test problems 0-199", "_512": "at 512 new tokens, test problems 0-199",
          "_untouched_256": "at 256 new tokens, test problems 200-1318 (plan.md)",
          "_untouched_512": "at 512 new tokens, test problems 200-1318 (plan.md)"}


def main(run):
    run = Path(run)
    if not run.is_dir():
        print(f"analyze.py: {run} is not a folder", file=sys.stderr)
        sys.exit(2)
    for suffix, label in LABELS.items():
        pair = [run / f"eval_{when}{suffix}.jsonl" for when in ("before", "after")]
        if all(p.exists() for p in pair):
            compare(*map(rows, pair), label)
            if not suffix and control_file(run):
                control_row(run, *map(rows, pair))
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


def plot_curves(runs, out):
    """Four curves per step for each 'folder[=label]' (the first solid, any other dashed, for a repeat beside it);
    the greedy accuracies are in the report's tables, not here."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = (("reward_mean", "share of sampled answers right (the mean reward)"),
              ("completion_len_mean", "mean completion length, tokens"),
              ("truncated_frac", "share of samples cut at the token limit"),
              ("policy_kl", "policy moved: KL(before || after), nats a token"))
    fig, axes = plt.subplots(2, 2, figsize=(10, 6))
    for n, run in enumerate(runs):
        folder, _, name = str(run).partition("=")
        folder = Path(folder)
        metrics = rows(folder / "metrics.jsonl")
        name, style = name or folder.resolve().name, "o-" if n == 0 else "s--"
        steps = [m["step"] for m in metrics]
        for ax, (key, title) in zip(axes.flat, panels):
            ax.plot(steps, [m[key] for m in metrics], style, markersize=3, label=name)
            ax.set(title=title, xlabel="step")
        if any(m["policy_kl"] > 0 for m in metrics):   # a run without signal moved nothing: no log scale then
            axes[1, 1].set_yscale("log")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    # below the panels, where it covers no point
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent
    main(folder)
    if len(sys.argv) > 2:
        plot_curves(sys.argv[3:] or [folder], sys.argv[2])
