"""The demo learns: `--demo` through the real CLI must raise held-out accuracy clearly.

The full default demo (seed 0, about 2 minutes) rather than a shortened one: the reward climbs slowly for the
first ~150 GRPO steps and fast after, so a 250-step run moved accuracy by only 5 points. The threshold is 10
points (about four standard errors on 300 problems); the demo's +25-point goal is not met on every seed yet
(report.md, section 4).
"""
import json

from test_cli import run_cli


def test_demo_improves_held_out_accuracy_by_10_points(tmp_path):
    out = tmp_path / "demo"
    result = run_cli(["--demo", "--seed", "0", "--output-dir", str(out)])
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    assert 0.1 <= before <= 0.6, "the warm-up should leave the policy partly competent"
    assert after - before >= 0.10, f"GRPO moved held-out accuracy only from {before:.1%} to {after:.1%}"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 400
    assert (out / "final" / "model.safetensors").exists() and (out / "plots" / "reward.png").exists()
    assert "Accuracy after training:" in result.stdout and "| after: " in result.stdout
