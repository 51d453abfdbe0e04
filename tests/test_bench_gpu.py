"""tests/bench_gpu.py works end to end: on CPU at reduced depth and width (a smoke test, not a timing; at the real
width its 233M-parameter embedding alone made the optimizer step and checkpoint half of the test's time)."""
import subprocess
import sys

from conftest import ROOT


def test_gpu_bench_runs_every_phase_and_generation_mode_at_reduced_depth_and_width():
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_gpu.py"), "--device", "cpu", "--layers", "1",
                             "--hidden-size", "96", "--steps", "2", "--batch-size", "1", "--group-size", "2",
                             "--max-new-tokens", "2", "--first-step-tokens", "1", "--generation-batch-size", "2",
                             "--micro-batch-size", "2"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "Qwen2.5-1.5B shape, 1 layers, width 96, 0.06 GiB of weights" in out and "copy bandwidth" in out
    assert "step: generation" in out and "update" in out and "checkpoint" in out
    # --first-step-tokens: the untimed step 0 generates 1 new token, the timed step --max-new-tokens (a random model
    # almost never samples EOS, so each runs to its limit)
    assert "step 0: 1 new tokens" in out and "step 1: 2 new tokens" in out, out
    assert "vs bandwidth bound" in out
    assert "static cache + compile" in out and "continuous batching" in out and "identical tokens: True" in out
    assert "its log-probs vs the pipeline's" in out and "agree within 2e-04: True" in out


def test_compiled_generation_bench_runs_both_paths_and_compiles_one_graph_for_three_widths():
    """tests/bench_compiled.py, #95's one-call GPU benchmark, in its CPU smoke form (inductor on this CPU)."""
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_compiled.py"), "--device", "cpu", "--layers",
                             "1", "--hidden-size", "96", "--tokens", "4", "--rows", "4", "--group-size", "2",
                             "--prompt-tokens", "20"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "dynamic cache (today)" in out and "compiled graphs after each call: [0, 0, 0]" in out
    assert "static cache + torch.compile" in out and "compiled graphs after each call: [1, 1, 1]" in out, out
    assert "identical greedy tokens (first width): True" in out and "a whole defaults step" in out
