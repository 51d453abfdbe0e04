"""tests/bench_gpu.py works end to end: on CPU at reduced depth (a smoke test, not a timing)."""
import subprocess
import sys

from conftest import ROOT


def test_gpu_bench_runs_every_phase_and_generation_mode_at_reduced_depth():
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_gpu.py"), "--device", "cpu", "--layers", "1",
                             "--steps", "2", "--batch-size", "1", "--group-size", "2", "--max-new-tokens", "2",
                             "--generation-batch-size", "2", "--micro-batch-size", "2"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "Qwen2.5-1.5B shape, 1 layers" in out and "copy bandwidth" in out
    assert "step: generation" in out and "update" in out and "checkpoint" in out
    assert "vs bandwidth bound" in out
    assert "static cache + compile" in out and "continuous batching" in out and "identical tokens: True" in out
    assert "its log-probs vs the pipeline's" in out and "agree within 2e-04: True" in out


def test_gpu_bench_runs_its_lora_row_at_reduced_depth():
    """--lora-rank wraps the model with peft as the CLI does (gh.with_lora); its steps and checkpoint run."""
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_gpu.py"), "--device", "cpu", "--layers", "1",
                             "--steps", "2", "--batch-size", "1", "--group-size", "2", "--max-new-tokens", "2",
                             "--generation-batch-size", "2", "--micro-batch-size", "2", "--lora-rank", "2",
                             "--skip-compile"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "config: LoRA 2, 1 prompts x 2 samples" in result.stdout and "step 1: generation" in result.stdout
    assert "step: generation" in result.stdout and "greedy generation" not in result.stdout
