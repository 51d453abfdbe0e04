"""Several processes through torchrun (gloo on CPU): the same script, data-parallel, on the tiny model."""
import json
import os
import subprocess
import sys

import torch

from conftest import ROOT, cli_env
from test_cli import GPU_PRECISION, SCRIPT, tiny_args
from torchrun_worker import tiny_policy, update_once

WORKER = str(ROOT / "tests" / "torchrun_worker.py")


def torchrun(*args, timeout=300):
    env = cli_env(OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_two_processes_with_two_prompts_each_equal_one_process_with_all_four(tmp_path):
    out = tmp_path / "weights.pt"
    result = torchrun(WORKER, "update", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    two_processes = torch.load(out)
    start = {name: p.detach() for name, p in tiny_policy()[1].named_parameters()}
    for loss_agg in ("seq-mean", "token-mean"):
        one_process = update_once(loss_agg)
        moved = [k for k in one_process if not torch.equal(one_process[k], start[k])]
        assert len(moved) >= len(one_process) - 1, "the step must move (almost) every weight"
        for name, weight in one_process.items():
            torch.testing.assert_close(two_processes[loss_agg][name], weight, rtol=1e-5, atol=1e-6, msg=name)
    if "lora" in two_processes:                             # peft installed (CI installs it)
        adapters = update_once("seq-mean", lora=True)      # LoRA: B starts at 0, so one step moves B alone
        assert len(adapters) == 2 * 7 * 2 and two_processes["lora"].keys() == adapters.keys()   # A, B x 7 x 2 layers
        assert all(w.abs().sum() > 0 for name, w in adapters.items() if "lora_B" in name)
        for name, weight in adapters.items():
            torch.testing.assert_close(two_processes["lora"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
    else:
        assert os.environ.get("CI") is None, "CI installs peft: the LoRA check must run there"
    for name, weight in update_once("seq-mean", silent=True).items():   # no pass, no step, no process hung
        assert torch.equal(weight, start[name]), name
        torch.testing.assert_close(two_processes["silent"][name], weight, rtol=0, atol=1e-7, msg=name)


def test_check_replicas_catches_differing_weights_and_oom_is_reported_not_retried(tmp_path):
    out = tmp_path / "caught.txt"
    result = torchrun(WORKER, "desync", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    replicas, oom = out.read_text().splitlines()
    assert "weights differ after step 1" in replicas
    assert "under torchrun at --micro-batch-size 8 | resume with --micro-batch-size 4" in oom


def test_torchrun_cli_run_writes_one_record_keeps_replicas_equal_and_resumes(warm_model_dir, addition_dir, tmp_path):
    """In the GPU job's precision: bf16 weights whose steps are rounded stochastically (each process draws the same
    rounding noise, or the replicas would part), gradient checkpointing; every weight trains. LoRA under DDP is
    test_two_processes_...'s."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    args = ["--prompt-style", "plain", "--train-size", "0", "--batch-size", "4", "--learning-rate", "5e-4",
            "--check-replicas", "--save-every", "2", *GPU_PRECISION]
    result = torchrun(SCRIPT, *tiny_args(warm_model_dir, addition_dir, whole, "--max-steps", "4", *args))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("Training completed!") == 1                 # one process prints
    metrics = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]                     # one writer, not one per process
    assert all(m["samples"] == 2 * 4 * 4 for m in metrics)                  # 2 processes x 4 prompts x group 4
    assert all("weight_checksum" in m for m in metrics)                     # checked after every step
    assert any(m["zero_spread_frac"] < 1 and m["grad_norm"] > 0 for m in metrics[2:])
    assert json.loads((whole / "config.json").read_text())["processes"] == 2
    questions = [json.loads(line)["question"] for line in (whole / "eval_before.jsonl").read_text().splitlines()]
    from datasets import load_dataset
    assert questions == load_dataset(str(addition_dir), "main", split="test[:4]")["question"]  # in order
    assert (whole / "final" / "model.safetensors").exists() and (whole / "plots" / "reward.png").exists()

    assert torchrun(SCRIPT, *tiny_args(warm_model_dir, addition_dir, split, "--max-steps", "2", *args)).returncode == 0
    resumed = torchrun(SCRIPT, "--resume", str(split), "--max-steps", "4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    from safetensors.torch import load_file
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(split / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(warm_model_dir / "model.safetensors")
    assert all(a[k].dtype == torch.bfloat16 for k in a)
    assert any(not torch.equal(a[k], start[k].bfloat16()) for k in start)
    single = subprocess.run([sys.executable, SCRIPT, "--resume", str(split), "--max-steps", "6"], capture_output=True,
                            text=True)
    assert single.returncode == 2 and "written by 2 process(es)" in single.stderr
