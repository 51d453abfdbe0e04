"""The command line as users run it: real subprocess runs on the tiny model, bad input, resume, Ctrl-C, OOM."""
import copy
import json
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

import grpo_homework as gh
from conftest import PROBLEMS, ROOT, cli_env, update_once

SCRIPT = str(ROOT / "grpo_homework.py")
PROGRESS = ["Loading tokenizer and model...", "Loading dataset...", "Setting up optimizer...",
            "Starting GRPO training...", "Training completed!"]


def tiny_args(model_dir, gsm8k_dir, out, *extra, step_per_batch=True):
    """Plots are drawn once, at the end: redrawing them each step took about 40% of a tiny run's time. A step per
    batch (--min-signal-groups 0): the tiny model's groups rarely have reward spread, so the default would draw 5
    batches a step; the tests of signal filling ask for it. fp32 unless a test asks for bf16: the same precision on
    every CPU, whatever --dtype auto picks there."""
    return [str(model_dir), "--dataset", str(gsm8k_dir), "--output-dir", str(out), "--device", "cpu",
            "--train-size", "8", "--eval-size", "4", "--batch-size", "2", "--group-size", "4",
            "--max-new-tokens", "8", "--generation-batch-size", "4", "--micro-batch-size", "3", "--eval-batch-size",
            "4", "--lr-warmup-steps", "0", "--learning-rate", "1e-3", "--plot-every", "0", "--dtype", "float32",
            *(["--min-signal-groups", "0"] if step_per_batch else []), *extra]


def run_cli(args, **kwargs):
    env = cli_env()
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=300,
                          **kwargs)


def run_clis(*commands):
    """Tiny runs side by side, a thread each (a tiny model gains nothing from two): a core each on the suite's two."""
    env = cli_env(OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for args in commands]
    try:
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:                 # a hung run must not burn the cores the rest of the suite needs
        for p in procs:
            p.kill()
            p.wait()
    return [subprocess.CompletedProcess(p.args, p.returncode, *output) for p, output in zip(procs, outputs)]


def test_cli_run_writes_the_whole_record(model_dir, gsm8k_dir, tmp_path):
    out = tmp_path / "run"
    result = run_cli(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "2", "--kl-coef", "0.05", "--plot-every", "1"))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert [line for line in lines if line in PROGRESS] == PROGRESS
    assert any(line.startswith("Accuracy before training:") for line in lines)
    [after] = [line for line in lines if line.startswith("Accuracy after training:")]
    summary = json.loads((out / "summary.json").read_text())      # the report's words, summary.json's counts
    assert f"; {summary['gained']} newly right, {summary['lost']} newly wrong, sign test p = " in after, after
    assert re.search(r"; difference's 95% CI [+-]\d+\.\d to [+-]\d+\.\d points\)$", after), after

    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for key in ("reward_mean", "reward_std", "zero_spread_frac", "loss", "clipfrac", "approx_kl", "kl_ref",
                "completion_len_mean", "completion_len_max", "truncated_frac", "grad_norm", "lr", "gen_seconds",
                "update_seconds", "tokens_per_s", "entropy"):
        assert key in metrics[0], key
    assert all(m["entropy"] is None or 0 < m["entropy"] < 6 for m in metrics)     # nats; a 300-token vocabulary
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["accuracy_before"] <= 1 and 0 <= summary["accuracy_after"] <= 1
    assert summary["steps"] == 2 and summary["wall_seconds"] > 0 and summary["finished"]
    before, after = ([json.loads(line) for line in (out / name).read_text().splitlines()]
                     for name in ("eval_before.jsonl", "eval_after.jsonl"))
    assert summary["gained"] == sum(a["correct"] > b["correct"] for b, a in zip(before, after))
    assert summary["lost"] == sum(a["correct"] < b["correct"] for b, a in zip(before, after)) and summary["sign_test_p"]
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["kl_coef"] == 0.05 and config["config"]["group_size"] == 4 and "torch" in config["versions"]
    for name in ("eval_before.jsonl", "eval_after.jsonl"):
        records = [json.loads(line) for line in (out / name).read_text().splitlines()]
        assert len(records) == 4 and {"question", "gold", "completion", "extracted", "correct"} <= set(records[0])
    assert (out / "report_draft.md").read_text().startswith("# Report draft: GRPO on ")
    assert all((out / "plots" / p).stat().st_size > 1000 for p in ("reward.png", "length.png", "clip_kl.png",
                                                                       "entropy.png"))

    from transformers import AutoModelForCausalLM, AutoTokenizer
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    start = AutoModelForCausalLM.from_pretrained(model_dir)
    assert AutoTokenizer.from_pretrained(out / "final").eos_token == "<|im_end|>"
    assert final.state_dict().keys() == start.state_dict().keys()
    assert torch.isfinite(final(torch.tensor([[1, 2, 3]])).logits).all()

    (out / "plots" / "reward.png").unlink()
    (out / "report_draft.md").unlink()
    report = run_cli(["--report", str(out)])
    assert report.returncode == 0 and (out / "plots" / "reward.png").exists() and (out / "report_draft.md").exists()


def test_help_lists_every_flag_with_its_default():
    result = run_cli(["--help"])
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for name in ("--group-size", "--max-new-tokens", "--learning-rate", "--prompt-style", "--loss-agg", "--demo",
                 "--resume", "--report", "--save-every", "--kl-coef", "--ppo-epochs", "--format-reward"):
        assert name in text, name
    assert "(the G of GRPO) (default: 16)" in text and "(default: ./gsm8k)" in text


@pytest.mark.parametrize("case, message", [
    (lambda m, d: ["/nonexistent/model"], "not a model directory"),
    (lambda m, d: [str(d)], "not a model directory"),
    (lambda m, d: [], "MODEL_PATH is required"),
    (lambda m, d: [str(m), "--dataset", "./no-such-gsm8k"], "does not exist"),
    (lambda m, d: [str(m), "--dataset", str(d), "--group-size", "1"], "--group-size"),
    (lambda m, d: [str(m), "--dataset", str(d), "--max-new-tokens", "0"], "--max-new-tokens"),
    (lambda m, d: [str(m), "--dataset", str(d), "--temperature", "0"], "--temperature"),
    (lambda m, d: [str(m), "--dataset", str(d), "--group-size", "3", "--generation-batch-size", "8"], "multiple"),
    (lambda m, d: [str(m), "--dataset", str(d), "--batch-size", "9", "--eval-size", "1"], "fewer than"),
    (lambda m, d: ["--resume", str(d)], "not a run directory"),
    (lambda m, d: ["--report", str(d)], "not a run directory"),
])
def test_bad_input_gives_one_line_exit_2_and_writes_nothing(model_dir, gsm8k_dir, tmp_path, capsys, case, message):
    out = tmp_path / "never-written"
    args = case(model_dir, gsm8k_dir)
    code = gh.main(args if "--report" in args else args + ["--output-dir", str(out), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and message in err[-1], err
    assert not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--group-size", "abc"], "argument --group-size: invalid int value: 'abc'"),
    (["--task", "nope"], "argument --task: invalid choice"),
    (["--parallel", "fsdp"], "unrecognized arguments: --parallel fsdp")])      # a flag of an earlier version
def test_a_flag_argparse_cannot_read_is_one_line_not_the_usage(tmp_path, capsys, flags, message):
    assert gh.main(["model", *flags, "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}") and "(--help lists every flag)" in err[0], err
    assert not (tmp_path / "run").exists()


def test_tokenizerless_model_dir_and_real_exit_code(model_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((model_dir / "config.json").read_text())
    result = run_cli([str(bare), "--output-dir", str(tmp_path / "out")])
    assert result.returncode == 2 and "no tokenizer" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_run_is_never_overwritten(model_dir, gsm8k_dir, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"config": {}, "argv": []}')
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out)) == 2
    assert "already holds a run" in capsys.readouterr().err


# The GPU job's precision: bf16 weights (fp32 moments, stochastically rounded steps) and gradient checkpointing.
GPU_PRECISION = ["--dtype", "bfloat16", "--gradient-checkpointing", "on"]


def test_resumed_run_ends_bit_identical_to_an_uninterrupted_one(warm_model_dir, addition_dir, tmp_path):
    """In the GPU job's precision, whose resume had most to lose (fp32 moments, the rounding generator); the
    fp32 path shares all of it but the dtype of the weights."""
    whole, split, precision = tmp_path / "whole", tmp_path / "split", GPU_PRECISION
    args = ["--prompt-style", "plain", "--train-size", "0", "--batch-size", "4", "--learning-rate", "5e-4",
            *precision]
    for result in run_clis(tiny_args(warm_model_dir, addition_dir, whole, "--max-steps", "4", "--save-every", "2",
                                     *args),
                           tiny_args(warm_model_dir, addition_dir, split, "--max-steps", "2", "--save-every", "2",
                                     *args)):
        assert result.returncode == 0, result.stderr[-2000:]
    (resumed,) = run_clis(["--resume", str(split), "--max-steps", "4", "--keep-checkpoints", "1"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Resuming from" in resumed.stdout
    from safetensors.torch import load_file
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(split / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(warm_model_dir / "model.safetensors")
    assert any(not torch.equal(a[k], start[k]) for k in a), "the steps must move the weights, or nothing is tested"
    metrics = [json.loads(line) for line in (split / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    record = json.loads((split / "config.json").read_text())        # the starting command stays, resumes follow it
    assert "--resume" not in record["argv"] and "--save-every" in record["argv"]
    (resumed,) = record["resumes"]
    assert resumed["argv"][1:] == ["--resume", str(split), "--max-steps", "4", "--keep-checkpoints", "1"]
    assert resumed["at_step"] == 2
    assert json.loads((whole / "config.json").read_text())["resumes"] == []
    # the test means something only if sampled rewards moved the weights after the checkpoint
    assert any(m["zero_spread_frac"] < 1 and m["grad_norm"] > 0 for m in metrics[2:])
    start = load_file(warm_model_dir / "model.safetensors")
    assert all(a[k].dtype == torch.bfloat16 for k in a) and any(not torch.equal(a[k], start[k].bfloat16()) for k in a)
    # by default every checkpoint stays; --keep-checkpoints 1 (allowed on resume) deleted step-2 once step-4 was written
    assert sorted(p.name for p in (whole / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert sorted(p.name for p in (split / "checkpoints").iterdir()) == ["step-4"]
    final, _ = gh.load_model_and_tokenizer(str(split / "final"), torch.device("cpu"), "bfloat16")
    assert torch.isfinite(final(torch.tensor([[1, 2, 3]])).logits).all()


def test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(model_dir, gsm8k_dir, tmp_path):
    """In the GPU job's precision, where the optimizer's fp32 state must survive the checkpoint."""
    out = tmp_path / "run"
    env = cli_env()
    proc = subprocess.Popen([sys.executable, SCRIPT, *tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "500",
                                                                 "--num-epochs", "200", *GPU_PRECISION)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in err
    assert f"--resume {out}" in err.strip().splitlines()[-1]
    steps = len((out / "metrics.jsonl").read_text().splitlines())
    assert (out / "checkpoints" / f"step-{steps}" / "trainer_state.safetensors").exists()
    assert json.loads((out / "summary.json").read_text())["steps"] == steps
    assert (out / "plots" / "reward.png").exists()
    resumed = run_cli(["--resume", str(out), "--max-steps", str(steps + 1)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == steps + 1


@pytest.mark.parametrize("error, fits_at, calls", [
    (torch.OutOfMemoryError("CUDA out of memory"), 2, [8, 4, 2]),
    # an allocation failure that a library reports as a plain RuntimeError is halved too
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), 4, [8, 4])])
def test_out_of_memory_halves_the_micro_batch(error, fits_at, calls):
    cfg = gh.RunConfig(micro_batch_size=8)
    seen = []

    def step():
        seen.append(cfg.micro_batch_size)
        if cfg.micro_batch_size > fits_at:
            raise error
        return "done"
    assert gh.retry_after_oom(step, lambda: gh.halve(cfg, "micro_batch_size")) == "done" and seen == calls


def test_out_of_memory_at_the_floor_is_a_clear_error_and_other_errors_pass_through():
    cfg = gh.RunConfig(micro_batch_size=2)

    def always():
        raise torch.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(gh.OutOfMemory, match="--max-new-tokens"):
        gh.retry_after_oom(always, lambda: gh.halve(cfg, "micro_batch_size"))
    cfg = gh.RunConfig(group_size=4, generation_batch_size=16)
    with pytest.raises(gh.OutOfMemory):
        gh.retry_after_oom(always, lambda: gh.halve(cfg, "generation_batch_size"))
    assert cfg.generation_batch_size == 4                 # never below one whole group
    with pytest.raises(RuntimeError, match="shape mismatch"):                  # other errors are not swallowed
        gh.retry_after_oom(lambda: (_ for _ in ()).throw(RuntimeError("shape mismatch")),
                           lambda: gh.halve(cfg, "micro_batch_size"))


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.1 GiB"),
                                   RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED")])
def test_out_of_memory_in_the_optimizer_step_is_final_not_retried(model_and_tokenizer, error, monkeypatch):
    """The step runs once: no micro-batch halving (it would rerun the passes and step a second time), and the
    message names what the optimizer holds instead of batch sizes."""
    from test_grpo import _rollout
    model, tok = model_and_tokenizer
    cfg = gh.RunConfig(group_size=4, max_new_tokens=6, micro_batch_size=4)
    rollout = _rollout(model, tok, cfg)
    optimizer = gh.build_optimizer(model.parameters(), lr=1e-3)
    steps, real_step = [], optimizer.step

    def step_that_runs_out():
        steps.append(1)
        real_step()                              # part of the state is updated, as when a GPU fails midway
        raise error
    monkeypatch.setattr(optimizer, "step", step_that_runs_out)
    with pytest.raises(gh.UserError) as caught:
        update_retrying_smaller(model, optimizer, rollout, cfg)
    message = str(caught.value)
    assert steps == [1] and cfg.micro_batch_size == 4
    assert "optimizer step" in message and "AdamW moments" in message and "--lora-rank 16" in message
    assert "--max-new-tokens" not in message
    assert all(state["step"] == 1 for state in optimizer.state.values())


def update_retrying_smaller(model, optimizer, rollout, cfg):
    """A run's step on `rollout`, retried after out-of-memory as Run.train retries it (Run.retry_smaller)."""
    import types
    hooks = gh.UpdateHooks(cfg, optimizer, model=model)
    run = types.SimpleNamespace(optimizer=optimizer, updates_at_record=0, model=model, cfg=cfg, phase="update",
                                pool=[], last_record=None, start={})
    while True:
        try:
            return update_once(model, optimizer, rollout, cfg, hooks=hooks)
        except RuntimeError as e:
            if not gh.is_out_of_memory(e):
                raise
            run.updates_settled = hooks.updates_settled
            gh.Run.retry_smaller(run)


def test_a_step_that_runs_out_of_memory_in_its_update_is_retried_with_half_the_micro_batch(model_and_tokenizer,
                                                                                            monkeypatch):
    from test_grpo import _rollout
    model, tok = model_and_tokenizer
    cfg = gh.RunConfig(group_size=4, max_new_tokens=6, micro_batch_size=4)
    rollout, real, sizes = _rollout(model, tok, cfg), gh.compute_logprobs_from_model, []

    def logprobs(model, input_ids, *args, **kwargs):
        if torch.is_grad_enabled():
            sizes.append(len(input_ids))
            if len(input_ids) > 1:
                raise torch.OutOfMemoryError("CUDA out of memory")
        return real(model, input_ids, *args, **kwargs)
    monkeypatch.setattr(gh, "compute_logprobs_from_model", logprobs)
    record = update_retrying_smaller(model, gh.build_optimizer(model.parameters(), lr=1e-3), rollout, cfg)
    assert sizes[:3] == [4, 2, 1] and cfg.micro_batch_size == 1 and record["skipped"] == 0


@pytest.mark.parametrize("ppo_epochs, fails_in", [(2, "epoch 2's forward"), (1, "the policy_kl pass after the step")])
def test_out_of_memory_after_an_optimizer_step_is_not_retried(model_and_tokenizer, monkeypatch, ppo_epochs, fails_in):
    """A retry of the whole update would apply the step that already ran a second time (AdamW's count 2 or 3) and,
    with two epochs, compute the old log-probs from the updated policy: it fails instead, naming a smaller
    micro-batch for the resume, which restarts the step from the last checkpoint."""
    from test_grpo import _rollout
    model, tok = model_and_tokenizer
    cfg = gh.RunConfig(group_size=4, max_new_tokens=6, micro_batch_size=4, ppo_epochs=ppo_epochs)
    rollout = _rollout(model, tok, cfg)
    optimizer = gh.build_optimizer(model.parameters(), lr=1e-3)
    real, failed = gh.compute_logprobs_from_model, []

    def logprobs(*args, **kwargs):     # runs out once, at the first pass after the optimizer's first step (epoch 2's
        if optimizer.state and not failed:     # forward, or the policy_kl pass): a retry would then succeed
            failed.append(fails_in)
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(*args, **kwargs)
    monkeypatch.setattr(gh, "compute_logprobs_from_model", logprobs)
    with pytest.raises(gh.OutOfMemory, match="not retried") as caught:
        update_retrying_smaller(model, optimizer, rollout, cfg)
    assert all(state["step"] == 1 for state in optimizer.state.values()), fails_in
    assert cfg.micro_batch_size == 4 and caught.value.resume_flags == " --micro-batch-size 2"


def test_out_of_memory_at_the_smallest_batch_mid_run_names_the_checkpoint_and_a_resume_that_works(
        model_dir, gsm8k_dir, tmp_path, capsys, monkeypatch):
    out, real, calls = tmp_path / "run", gh.UpdateHooks.updates, []

    def update(self, rollout):                               # each try of step 4 begins with its updates
        calls.append(1)
        if len(calls) > 1:                                   # step 2 on: every micro-batch size runs out
            raise torch.OutOfMemoryError("CUDA out of memory")
        yield from real(self, rollout)
    monkeypatch.setattr(gh.UpdateHooks, "updates", update)
    assert gh.main([str(a) for a in tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "3")]) == 2
    assert len(calls) == 3                                   # step 1, then --micro-batch-size 3 -> 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "out of memory even at --micro-batch-size 1" in last, last
    assert f"--resume {out} (from checkpoints/step-1)" in last, last
    monkeypatch.setattr(gh.UpdateHooks, "updates", real)   # the resume the line names runs, on a device with room
    assert gh.main(["--resume", str(out)]) == 0
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_out_of_memory_in_the_optimizer_step_suggests_lora_only_where_every_weight_trains(model_and_tokenizer):
    model = copy.deepcopy(model_and_tokenizer[0])
    for frozen, suggested in ((False, True), (True, False)):      # frozen: as under LoRA, most weights fixed
        model.model.requires_grad_(not frozen)
        message = str(gh.optimizer_out_of_memory(model))
        assert ("--lora-rank 16" in message) == suggested and "--dtype bfloat16" in message


@pytest.mark.parametrize("capability, expected", [((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16),
                                                  ((7, 5), torch.float32), ((6, 1), torch.float32)])
def test_dtype_auto_is_bf16_only_where_the_gpu_computes_it(monkeypatch, capsys, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    assert gh.weight_dtype("auto", torch.device("cuda")) == expected
    err = capsys.readouterr().err
    assert ("no native bf16" in err and "twice the memory" in err) == (expected == torch.float32)
    assert gh.weight_dtype("bfloat16", torch.device("cuda")) == torch.bfloat16      # asked for: as asked


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(True, False, torch.bfloat16), (False, True, torch.bfloat16),
                                                        (False, False, torch.float32)])
def test_dtype_auto_is_bf16_only_where_the_cpu_computes_it(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert gh.weight_dtype("auto", torch.device("cpu")) == expected
    assert gh.weight_dtype("float32", torch.device("cpu")) == torch.float32          # asked for: as asked
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")         # a torch without the probes: fp32
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert gh.weight_dtype("auto", torch.device("cpu")) == torch.float32


ONEDNN_TRAP = """
import sys, torch
import grpo_homework as gh
from transformers import Qwen2Config, Qwen2ForCausalLM
config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)
model = Qwen2ForCausalLM(config).to(torch.bfloat16).requires_grad_(False)       # frozen, as under LoRA
gh.contiguous_lm_head_input(model)              # as load_model_and_tokenizer sets it for every model a run loads
ids = torch.randint(3, 200, (100, 6))
gh.generate_completions(model, gh.build_byte_tokenizer(), ids, torch.ones_like(ids), 2, temperature=0.0, num_samples=1)
print("oneDNN on:", torch.backends.mkldnn.enabled)
"""


@pytest.mark.skipif(not gh.weight_dtype("auto", torch.device("cpu")) == torch.bfloat16,
                    reason="this CPU computes bf16 without oneDNN's native kernels, where the trap cannot show")
def test_a_bf16_evaluation_batch_of_100_rows_keeps_onednn_on():
    """Qwen's LM-head shape, frozen, in bf16: the last position's strided slice made oneDNN ask for 100 x 896 x
    151,936 x 2 bytes (27 GB), fail, and turn itself off for the process. In a subprocess: a failure would slow
    every later test."""
    result = subprocess.run([sys.executable, "-c", ONEDNN_TRAP], capture_output=True, text=True, env=cli_env(),
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "oneDNN on: True" in result.stdout and "mkldnn_matmul failed" not in result.stderr


@pytest.mark.parametrize("name, current, index", [("auto", 0, 0), ("cuda", 1, 1), ("cuda:1", 0, 1)])
def test_cuda_device_gets_an_index_before_set_device(monkeypatch, name, current, index):
    """torch.cuda.set_device refuses a device without an index ("Expected a torch.device with a specified index"):
    the first CUDA run failed so while loading. The fake set_device does torch's own check of its argument."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: chosen.append(torch._utils._get_device_index(device, optional=False)))
    assert gh.pick_device(name) == torch.device("cuda", index) and chosen == [index]
    with pytest.raises(gh.UserError, match="there are 2 CUDA GPUs here"):
        gh.pick_device("cuda:2")


def test_cuda_asked_for_without_a_gpu_is_one_line(monkeypatch):
    """Before any CUDA call (a CPU-only torch raises in current_device), the count refuses it in one line."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("asked a GPU-less torch for its device"))
    with pytest.raises(gh.UserError, match="--device cuda: there are 0 CUDA GPUs here"):
        gh.pick_device("cuda")


def test_the_demo_on_a_gpu_that_is_not_there_is_refused_before_its_warm_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(gh, "supervised_warmup", lambda *a, **k: pytest.fail("the warm-up ran"))
    assert gh.main(["--demo", "--device", "cuda", "--output-dir", str(tmp_path / "demo")]) == 2
    assert capsys.readouterr().err.strip() == "error: --device cuda: there are 0 CUDA GPUs here"
    assert not (tmp_path / "demo").exists()


def test_a_generated_task_runs_end_to_end_without_a_dataset_under_the_variant_flags(model_dir, tmp_path, capsys):
    out = tmp_path / "arithmetic"
    code = gh.main([str(model_dir), "--task", "arithmetic", "--output-dir", str(out), "--device",   # no --dataset
                    "cpu", "--train-size", "8", "--eval-size", "4", "--batch-size", "2", "--group-size", "4",
                    "--max-new-tokens", "8", "--generation-batch-size", "8", "--max-steps", "1",
                    "--advantage", "drgrpo", "--loss-agg", "drgrpo", "--ppo-epochs", "2", "--format-reward", "0.1"])
    assert code == 0, capsys.readouterr().err[-2000:]
    record = json.loads((out / "eval_before.jsonl").read_text().splitlines()[0])
    assert record["question"] == gh.TASKS["arithmetic"].load("", "test[:1]")[0]["question"]
    assert isinstance(record["gold"], float)
    summary = json.loads((out / "summary.json").read_text())
    assert "format_rate" in summary["after"] and summary["steps"] == 1


def test_evaluation_retries_out_of_memory_in_smaller_pieces(model_and_tokenizer, gsm8k_dir, monkeypatch):
    model, tok = model_and_tokenizer
    original = model.generate

    def generate(input_ids, **kwargs):
        if input_ids.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return original(input_ids=input_ids, **kwargs)
    monkeypatch.setattr(model, "generate", generate)
    dataset = gh.GSM8KDataset("train", tok, dataset_path=str(gsm8k_dir))
    cfg = gh.RunConfig(eval_batch_size=8, max_new_tokens=3)
    scores, records = gh.retry_after_oom(lambda: gh.evaluate(model, tok, dataset, cfg, torch.device("cpu")),
                                         lambda: gh.halve(cfg, "eval_batch_size"))      # as a run's evaluations
    assert len(records) == 8 and cfg.eval_batch_size == 2


# ----- signal per step and the validation split (#44) -----

@pytest.mark.parametrize("batch, n, flags, drawn_per_step", [
    (1, 2, ["--min-signal-groups", "2"], [3, 2, 3]),
    (2, 2, [], [4, 4]),          # the default: as many groups as --batch-size; the 8 problems last two steps
    (4, 1, ["--min-signal-groups", "1"], [4, 4])])      # a floor: no group of a batch with spread is left out
def test_min_signal_groups_draws_batches_until_enough_groups_have_spread_and_updates_on_those(
        model_dir, gsm8k_dir, tmp_path, monkeypatch, batch, n, flags, drawn_per_step):
    """A reward with spread only on even golds: each step draws batches until it holds n such groups (or its 3
    further draws run out), updates on max(n, batch) groups, those with spread first, and records what it drew;
    the data position follows."""
    def reward(completions, golds, **kwargs):
        return torch.tensor([float(g % 2 == 0 and i % 4 == 0) for i, g in enumerate(golds)])
    updated = []
    real_updates = gh.UpdateHooks.updates
    monkeypatch.setattr(gh, "compute_reward", reward)
    monkeypatch.setattr(gh.UpdateHooks, "updates", lambda self, rollout: updated.append(
        rollout.rewards.view(-1, 4)[:, 0].tolist()) or real_updates(self, rollout))
    out = tmp_path / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--batch-size", str(batch), "--max-steps", "3",
                             "--max-draws", "3", *flags, step_per_batch=False)) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    golds = [7, 60, 12, 2000, 42, 5, 6, 150]                       # PROBLEMS' gold numbers, in the data's order
    sampler = torch.utils.data.DistributedSampler(range(8), 1, 0, seed=0, drop_last=True)
    sampler.set_epoch(0)
    order, position = [golds[i] for i in sampler], 0
    for m, kept in zip(metrics, updated):
        drawn = []
        while len(drawn) < 4 * batch and sum(g % 2 == 0 for g in drawn) < n and position < len(order):
            drawn += order[position:position + batch]
            position += batch
        assert m["prompts_drawn"] == len(drawn) and m["batch_in_epoch"] == position // batch
        with_spread = [i for i, g in enumerate(drawn) if g % 2 == 0]
        chosen = sorted((with_spread + [i for i in range(len(drawn)) if i not in with_spread])[:max(n, batch)])
        assert m["signal_groups"] == min(max(n, batch), len(with_spread))
        assert kept == [float(drawn[i] % 2 == 0) for i in chosen]
        assert m["samples"] == 4 * len(drawn) and m["no_signal"] == (m["signal_groups"] == 0)
    assert [m["prompts_drawn"] for m in metrics] == drawn_per_step and len(updated) == len(drawn_per_step)


def test_validation_problems_are_the_first_of_the_train_split_and_never_trained_on(model_dir, gsm8k_dir, tmp_path,
                                                                                   monkeypatch):
    prompts_trained = []
    real = gh.generate_completions

    def generate(model, tok, input_ids, *args, **kwargs):
        if (args[2] if len(args) > 2 else kwargs["temperature"]) > 0:
            prompts_trained.extend(tok.batch_decode(input_ids, skip_special_tokens=True))
        return real(model, tok, input_ids, *args, **kwargs)
    monkeypatch.setattr(gh, "generate_completions", generate)
    out = tmp_path / "run"
    args = tiny_args(model_dir, gsm8k_dir, out, "--val-size", "3", "--eval-split", "validation", "--eval-size", "3",
                     "--max-steps", "2", "--train-size", "0")
    assert gh.main(args) == 0
    validation = [json.loads(line)["question"] for line in (out / "eval_before.jsonl").read_text().splitlines()]
    assert validation == [p["question"] for p in PROBLEMS[:3]]
    assert len(prompts_trained) == 2 * 2 and not any(q in p for q in validation for p in prompts_trained)
    assert all(any(p["question"] in t for p in PROBLEMS[3:]) for t in prompts_trained)
    assert "| 3 validation | 8 |" in (out / "report_draft.md").read_text()   # not "test"


@pytest.mark.parametrize("flags, message", [
    (["--eval-split", "validation"], "--eval-split validation scores the --val-size held-out problems"),
    (["--eval-split", "validation", "--val-size", "2", "--eval-size", "3"], "at least --eval-start + --eval-size"),
    (["--min-signal-groups", "-2"], "--min-signal-groups must be a count of groups, 0 (off) or -1 (--batch-size)"),
    (["--val-size", "7", "--train-size", "2"], "there are only 1 train problems")])
def test_validation_and_signal_flags_that_cannot_work_are_refused(model_dir, gsm8k_dir, tmp_path, capsys, flags,
                                                                   message):
    assert gh.main(tiny_args(model_dir, gsm8k_dir, tmp_path / "run", *flags)) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_step_bench_times_both_paths_on_the_same_rollout(model_dir):
    """tests/bench_step.py end to end at a tiny size, one step (a smoke test, not a timing; on SmolLM2 until
    2026-11-27, 20 s, most of it the first passes' warm-up)."""
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_step.py"), str(model_dir), "--task",
                             "arithmetic", "--steps", "0", "--batch-size", "1", "--group-size", "4",
                             "--max-new-tokens", "4"], capture_output=True, text=True, env=cli_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == [                 # after the header
        "| generation", "| log-probs, no grad (old policy / reference)",
        "| update, every group with spread",
        "| update, no group with spread", "| step with spread (generation + update)",
        "| step without spread (generation + update)"]


def test_dtype_bench_times_both_precisions_side_by_side(model_dir, gsm8k_dir):
    """tests/bench_dtype.py end to end at a tiny size (a smoke test, not a timing): both columns, every phase."""
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_dtype.py"), str(model_dir), "--dataset",
                             str(gsm8k_dir), "--batch-size", "1", "--group-size", "2", "--max-new-tokens", "4",
                             "--eval-size", "2"], capture_output=True, text=True, env=cli_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| ")]
    assert [r[0] for r in rows] == ["| phase (seconds)", "| generation", "| update", "| evaluation (frozen weights)"]
    assert rows[0][1:3] == ["float32", "bfloat16"] and all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows[1:])
    assert "oneDNN still on at the end: True" in result.stdout
