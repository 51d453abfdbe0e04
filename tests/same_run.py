"""Did a change to grpo_homework.py change what a run computes? Fixed-seed tiny CLI runs, compared field by field.

    python tests/same_run.py record DIR     # run the five tiny runs with this checkout's script; keep their records
    python tests/same_run.py compare A B    # metrics.jsonl (timings aside), eval records and final/ weights

Record once before a change (say from `git worktree add /tmp/before HEAD`) and once after, then compare: a
refactoring that moves code but not arithmetic gives the same records and byte-identical final/ weights. The runs
cover the paths a re-layout could disturb: signal filling (several draws a step), the KL reference with two PPO
epochs, the mean-only advantage with the GRPO paper's mean per completion, bf16 weights with stochastic rounding
and gradient checkpointing, LoRA (when peft is installed), and a checkpoint resumed mid-run. About two minutes.
Since Dr. GRPO's reduction became TODO 3's mean on length-scaled advantages, runs with --loss-agg drgrpo differ from
records made before at float rounding (a loss near 0 by construction, relatively more): record the baseline after it.
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMINGS = {"gen_seconds", "update_seconds", "tokens_per_s", "peak_mem_gb"}
COMMON = ["--device", "cpu", "--prompt-style", "plain", "--eval-size", "8", "--batch-size", "4", "--group-size", "8",
          "--max-new-tokens", "8", "--generation-batch-size", "16", "--micro-batch-size", "5", "--eval-batch-size",
          "4", "--lr-warmup-steps", "1", "--plot-every", "0", "--seed", "3", "--learning-rate", "5e-4",
          "--loss-agg", "drgrpo"]      # the default until 2026-11-29: the records before it hold this reduction
RUNS = {
    "signal": ["--max-steps", "3", "--max-draws", "2", "--min-signal-groups", "2", "--dtype", "float32"],
    "kl": ["--max-steps", "2", "--kl-coef", "0.05", "--ppo-epochs", "2", "--min-signal-groups", "0",
           "--dtype", "float32"],
    "mean-only": ["--max-steps", "2", "--advantage", "drgrpo", "--loss-agg", "seq-mean", "--min-signal-groups",
                  "0", "--dtype", "float32", "--mask-truncated"],
    "bf16": ["--max-steps", "2", "--dtype", "bfloat16", "--gradient-checkpointing", "on", "--min-signal-groups", "0"],
    "lora": ["--max-steps", "2", "--lora-rank", "4", "--learning-rate", "1e-2", "--min-signal-groups", "0",
             "--dtype", "float32"],
}


def build_inputs(folder: Path) -> tuple[Path, Path]:
    """The test suite's warmed-up tiny Qwen2 (right sometimes, so groups have reward spread and the update runs) and
    its addition problems in GSM8K's format, written once and reused by every recording."""
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import random
    import grpo_homework as gh
    from conftest import QWEN_CHAT_TEMPLATE
    model_dir, data_dir = folder / "model", folder / "data"
    if not model_dir.exists():
        tokenizer = gh.build_byte_tokenizer(chat_template=QWEN_CHAT_TEMPLATE)
        model = gh.build_tiny_model(tokenizer, seed=0)
        gh.supervised_warmup(model, tokenizer, gh.word_problems(500, random.Random(1)),
                             gh.DemoConfig(warmup_max_steps=100, warmup_target=0.15), seed=0)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        rng = random.Random(0)
        test = gh.word_problems(16, rng)
        train = gh.word_problems(64, rng, exclude={p["question"] for p in test})
        gh.write_hub_dataset(data_dir, {"train": train, "test": test})
    return model_dir, data_dir


def cli(script: Path, args: list[str]) -> None:
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONHASHSEED": "0"}
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env)
    if result.returncode:
        sys.exit(f"{' '.join(args[:3])}...: exit {result.returncode}\n{result.stderr[-2000:]}")


def record(out: Path, script: Path) -> None:
    model_dir, data_dir = build_inputs(out.parent / "inputs")
    import importlib.util
    for name, flags in RUNS.items():
        if name == "lora" and importlib.util.find_spec("peft") is None:
            continue
        cli(script, [str(model_dir), "--dataset", str(data_dir), "--output-dir", str(out / name), *COMMON, *flags])
    # resumed: two steps, checkpointed, then continued to four (bf16: the rounding generator must survive)
    flags = [*COMMON, "--dtype", "bfloat16", "--min-signal-groups", "0", "--save-every", "2"]
    cli(script, [str(model_dir), "--dataset", str(data_dir), "--output-dir", str(out / "resumed"), *flags,
                 "--max-steps", "2"])
    cli(script, ["--resume", str(out / "resumed"), "--max-steps", "4"])
    print(f"recorded {sorted(p.name for p in out.iterdir())} with {script}")


def digest(run: Path) -> dict:
    """What a run computed: its step records less timings, its evaluations, and a hash of each final/ file."""
    metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
               for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = {n: (run / n).read_text() for n in ("eval_before.jsonl", "eval_after.jsonl")}
    weights = {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted((run / "final").rglob("*.safetensors"))}
    return {"metrics": metrics, **evals, **weights}


def how_far(a: Path, b: Path, bad: list[str]) -> str:
    """For runs that differ: the largest relative difference of a metric, and of a weight (over the tensor's scale)."""
    import math
    from safetensors.torch import load_file
    worst = 0.0
    for ma, mb in zip(*(digest(run)["metrics"] for run in (a, b))):
        for key in ma.keys() & mb.keys():
            x, y = ma[key], mb[key]
            if isinstance(x, float) and isinstance(y, float) and x != y and math.isfinite(x) and math.isfinite(y):
                worst = max(worst, abs(x - y) / max(abs(x), abs(y)))
    weights = 0.0
    for key in (k for k in bad if k.endswith(".safetensors")):
        wa, wb = load_file(a / key), load_file(b / key)
        for name in wa.keys() & wb.keys():
            ta, tb = wa[name].float(), wb[name].float()
            weights = max(weights, ((ta - tb).abs().max() / ta.abs().max().clamp(min=1e-30)).item())
    return f"metrics within {worst:.1e} relative, weights within {weights:.1e} of their scale"


def compare(a: Path, b: Path) -> int:
    differ = 0
    for run in sorted(p.name for p in a.iterdir()):
        da, db = digest(a / run), digest(b / run)
        bad = [k for k in da.keys() | db.keys() if da.get(k) != db.get(k)]
        differ += bool(bad)
        print(f"{run:10s} {'SAME' if not bad else 'DIFFERENT: ' + ', '.join(sorted(bad))}"
              f" ({len(da['metrics'])} steps, {sum(k.endswith('.safetensors') for k in da)} weight files)"
              + (f"; {how_far(a / run, b / run, bad)}" if bad and "metrics" in bad or
                 any(k.endswith(".safetensors") for k in bad) else ""))
    return int(differ > 0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"] and len(sys.argv) in (3, 4):
        record(Path(sys.argv[2]).resolve(), Path(sys.argv[3] if len(sys.argv) == 4 else HERE.parent /
                                                 "grpo_homework.py").resolve())
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
