"""A run never loses work, never touches what it does not own, never unpickles, and refuses values that would
train wrong. One test per defect of the run-safety issue; interrupts are real SIGINTs to real CLI processes."""
import copy
import dataclasses
import json
import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch
from safetensors.torch import load_file

import grpo_homework as gh
from conftest import PROBLEMS, ROOT, SHARED_GSM8K, cli_env
from test_cli import SCRIPT, tiny_args


def main_err(args, capsys):
    """gh.main(args) in-process: (exit code, last stderr line)."""
    code = gh.main([str(a) for a in args])
    lines = capsys.readouterr().err.strip().splitlines()
    return code, lines[-1] if lines else ""


def files_under(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture(scope="module")
def finished_run(model_dir, gsm8k_dir, tmp_path_factory):
    """A finished 2-step run with checkpoints at both steps; tests copy it before damaging it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "2", "--save-every", "1")) == 0
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path):
    return shutil.copytree(finished_run, tmp_path / "run")


STARTED = []


@pytest.fixture(autouse=True)
def no_process_outlives_its_test():
    """A test that fails while its CLI runs must not leave it burning the CPU the rest of the suite needs."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def start_cli(args):
    env = cli_env()
    STARTED.append(subprocess.Popen([sys.executable, SCRIPT, *map(str, args)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env))
    return STARTED[-1]


def interrupt_after_line(proc, line, timeout=120):
    """Send SIGINT as soon as the process prints `line`; return (stdout so far + rest, stderr)."""
    seen, deadline = [], time.time() + timeout
    while time.time() < deadline:
        text = proc.stdout.readline()
        seen.append(text)
        if text.strip() == line or not text:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return "".join(seen) + out, err


# ----- 1. every phase survives Ctrl-C and a failure, and --resume finishes -----

# Long greedy answers, so that the evaluations last long enough to be interrupted
SLOW_EVAL = ("--max-new-tokens", "300", "--eval-batch-size", "1", "--max-steps", "1")


@pytest.mark.parametrize("line, phase", [
    ("Evaluating the starting model on 4 test problems...", "the evaluation before training"),
    ("Evaluating the trained model on 4 test problems...", "the final evaluation and save")])
def test_ctrl_c_in_either_evaluation_leaves_a_run_that_resume_finishes(model_dir, gsm8k_dir, tmp_path, capsys, line,
                                                                      phase):
    """The Ctrl-C goes to a real process; what follows runs in this one (the suite's time)."""
    out = tmp_path / "run"
    proc = start_cli(tiny_args(model_dir, gsm8k_dir, out, *SLOW_EVAL))
    _, err = interrupt_after_line(proc, line)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == f"error: interrupted during {phase}; resume with: python " \
                                           f"grpo_homework.py --resume {out}"
    assert not (out / "eval_after.jsonl").exists() and not (out / "final").exists()
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, *SLOW_EVAL), capsys)  # no loop: it points at --resume
    assert code == 2 and f"--resume {out}" in err
    assert gh.main(["--resume", str(out)]) == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 1 and (out / "final" / "model.safetensors").exists()
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    assert len((out / "eval_after.jsonl").read_text().splitlines()) == 4
    if phase.startswith("the final"):      # the checkpoint written before the final evaluation was resumed from
        assert "Resuming from" in capsys.readouterr().out and (out / "checkpoints" / "step-1").is_dir()


def test_a_failure_while_writing_final_leaves_a_run_that_resume_finishes(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                        monkeypatch):
    out = tmp_path / "run"
    real_save = gh.save_model

    def disk_full(path, *args, **kwargs):
        if path.name == "final.tmp":
            path.mkdir()
            (path / "model.safetensors").write_bytes(b"half")
            raise OSError(28, "No space left on device")
        return real_save(path, *args, **kwargs)
    monkeypatch.setattr(gh, "save_model", disk_full)
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "2"), capsys)
    assert code == 2 and "No space left on device" in err and err.endswith(f"--resume {out}")
    assert not (out / "final").exists() and not json.loads((out / "summary.json").read_text())["finished"]
    monkeypatch.setattr(gh, "save_model", real_save)
    assert gh.main(["--resume", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["finished"]
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(out / "final") is not None and not (out / "final.tmp").exists()


def test_ctrl_c_during_the_demo_warm_up_is_one_line_and_the_demo_starts_over(tmp_path):
    out = tmp_path / "demo"
    proc = start_cli(["--demo", "--output-dir", out])
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "demo_data").exists():   # the warm-up comes right after the data
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert re.fullmatch(r"error: interrupted while building the demo, \d+ s in: run the same command again to start "
                        r"it over", err.strip().splitlines()[-1]), err[-2000:]     # its time, not a guess at it
    small = gh.DemoConfig(train_problems=200, test_problems=10, warmup_max_steps=2, warmup_target=1.1)
    cfg = gh.dataclasses.replace(gh.demo_grpo_config(gh.RunConfig()), max_steps=1, batch_size=2, plot_every=0,
                                 show_examples=0, output_dir=str(out))
    assert gh.run_demo(cfg, small)["finished"]


class CtrlCInAFinalizer:
    """Python drops an exception raised in __del__: this is how a real Ctrl-C got lost in CI (in a regex
    object's __del__ during the demo), and the demo then ran to its end."""
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)       # the handler runs here, inside __del__


def test_a_ctrl_c_python_drops_in_a_finalizer_still_stops_the_run(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                   monkeypatch):
    out = tmp_path / "run"
    real_evaluate = gh.evaluate

    def evaluate_after_a_lost_ctrl_c(*args, **kwargs):
        CtrlCInAFinalizer()
        return real_evaluate(*args, **kwargs)
    monkeypatch.setattr(gh, "evaluate", evaluate_after_a_lost_ctrl_c)
    code = gh.main([str(a) for a in tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "Exception ignored" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: interrupted during the evaluation before training")
    assert signal.getsignal(signal.SIGINT) is not gh.on_ctrl_c and sys.unraisablehook is not None


class WriterCutShort:
    """What a Ctrl-C leaves behind mid-write: an object whose __del__ fails once its file is gone. In CI this
    was pyarrow's ParquetWriter ("write to closed file") after a Ctrl-C during the demo's data writing."""
    def __del__(self):
        raise ValueError("write to closed file")


def test_a_finalizer_that_fails_after_ctrl_c_prints_no_traceback(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)    # print as a plain python would

    def evaluate_interrupted_mid_write(*args, **kwargs):
        writer = WriterCutShort()       # noqa: F841 -- kept alive by the traceback until main has handled it
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    monkeypatch.setattr(gh, "evaluate", evaluate_interrupted_mid_write)
    code = gh.main([str(a) for a in tiny_args(model_dir, gsm8k_dir, tmp_path / "run", "--max-steps", "1")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "Exception ignored" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: interrupted during the evaluation before training")


# ----- 2. the demo deletes nothing it did not make -----

def test_demo_refuses_a_folder_that_holds_other_files_and_never_deletes_them(tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "demo_model").mkdir(parents=True)
    (out / "thesis.tex").write_text("years of work")
    code, err = main_err(["--demo", "--output-dir", out], capsys)
    assert code == 2 and "already holds other files" in err
    assert (out / "thesis.tex").read_text() == "years of work" and (out / "demo_model").is_dir()
    (out / "demo.json").write_text('{"demo": true}')      # even with the demo's marker: the thesis is not its own
    assert main_err(["--demo", "--output-dir", out], capsys)[0] == 2 and (out / "thesis.tex").exists()


def test_demo_with_resume_is_refused_and_the_run_is_untouched(run_copy, capsys):
    before = files_under(run_copy)
    code, err = main_err(["--demo", "--resume", run_copy], capsys)
    assert code == 2 and "cannot be combined" in err and files_under(run_copy) == before


# ----- 3. the output folder never overwrites the user's files -----

def test_output_dir_that_is_empty_the_model_or_a_used_folder_is_refused(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                        monkeypatch):
    model_config = (model_dir / "config.json").read_text()
    cases = [("", "must name a folder"), (model_dir, "inside the model folder"),
             (model_dir / "sub", "inside the model folder"), (ROOT, "already holds other files")]
    for out, message in cases:
        code, err = main_err(tiny_args(model_dir, gsm8k_dir, out), capsys)
        assert code == 2 and message in err, (out, err)
    assert (model_dir / "config.json").read_text() == model_config and not (model_dir / "sub").exists()
    assert not (ROOT / "metrics.jsonl").exists() and not (ROOT / "run.lock").exists()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, "~/runs/a", "--max-steps", "1"), capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "home" / "runs" / "a" / "summary.json").read_text())["finished"]
    assert not (tmp_path / "~").exists()


def test_an_output_dir_that_is_a_file_or_cannot_be_made_is_one_line_before_loading(model_dir, gsm8k_dir, tmp_path,
                                                                                   capsys):
    (tmp_path / "file").write_text("x")
    for out, message in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "run", "cannot use --output-dir")):
        code = gh.main(tiny_args(model_dir, gsm8k_dir, out))
        captured = capsys.readouterr()
        assert code == 2 and message in captured.err and "Loading tokenizer" not in captured.out
    assert (tmp_path / "file").read_text() == "x"


def test_bad_input_after_the_claim_leaves_no_folder_behind(model_dir, gsm8k_dir, tmp_path, capsys):
    out = tmp_path / "a" / "b" / "run"
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, "--max-prompt-length", "3"), capsys)
    assert code == 2 and "no test problems left" in err
    assert not (tmp_path / "a").exists()


# ----- 4. resuming never runs code from the checkpoint -----

class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['PWNED_PATH']}",))


def test_resume_reads_only_json_and_safetensors_and_never_unpickles(run_copy, tmp_path, capsys, monkeypatch):
    checkpoint = run_copy / "checkpoints" / "step-2"
    assert sorted(p.name for p in checkpoint.iterdir() if p.name.startswith("trainer_state")) == \
        ["trainer_state.json", "trainer_state.safetensors"]
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("PWNED_PATH", str(pwned))
    (checkpoint / "trainer_state.pt").write_bytes(pickle.dumps({"state": Payload()}))
    (checkpoint / "trainer_state.json").unlink()
    code, err = main_err(["--resume", run_copy, "--max-steps", "3"], capsys)
    assert code == 2 and "cannot read checkpoint" in err and "trainer_state.json" in err
    assert not pwned.exists()


@pytest.mark.parametrize("damage", ["truncate safetensors", "garbage json", "drop a key"])
def test_a_damaged_checkpoint_is_one_line_naming_it(run_copy, capsys, damage):
    checkpoint = run_copy / "checkpoints" / "step-2"
    if damage == "truncate safetensors":
        data = (checkpoint / "trainer_state.safetensors").read_bytes()
        (checkpoint / "trainer_state.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "garbage json":
        (checkpoint / "trainer_state.json").write_text("{not json")
    else:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        state["items"] = [kv for kv in state["items"] if kv[0] != "rng"]
        (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    code, err = main_err(["--resume", run_copy, "--max-steps", "3"], capsys)
    assert code == 2 and err.startswith("error: cannot read checkpoint") and str(checkpoint) in err


def test_checkpoint_state_round_trips_through_json_and_safetensors():
    state = {"optimizer": {"state": {0: {"step": 3, "exp_avg": torch.randn(2, 3)}}, "param_groups": [
        {"lr": 1e-6, "betas": (0.9, 0.999), "params": [0]}]}, "rng": [{"python": (3, (1, 2), None),
                                                                       "torch": torch.get_rng_state()}]}
    tensors = {}
    plain = json.loads(json.dumps(gh.to_plain(state, tensors)))
    back = gh.from_plain(plain, tensors)
    assert list(back["optimizer"]["state"]) == [0] and back["optimizer"]["state"][0]["step"] == 3
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert torch.equal(back["rng"][0]["torch"], state["rng"][0]["torch"])
    with pytest.raises(TypeError):
        gh.to_plain({"fn": print}, {})


def test_checkpoints_are_ordered_by_step_number_not_by_name(tmp_path):
    """--resume takes the last one and --keep-checkpoints deletes from the front: step-10 is newer than step-9."""
    for name in ("step-9", "step-10", "step-2", "step-11.tmp", "step-x"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert [p.name for p in gh.saved_checkpoints(tmp_path)] == ["step-2", "step-9", "step-10"]


# ----- 5. flag values that would train wrong are refused -----

@pytest.mark.parametrize("flag, value, message", [
    ("--max-grad-norm", "-1", "must be positive"), ("--max-grad-norm", "0", "must be positive"),
    ("--advantage-eps", "-1", "must not be negative"), ("--format-reward", "nan", "finite"),
    ("--format-reward", "-0.5", "must not be negative"), ("--clip-eps", "nan", "finite"),
    ("--clip-eps", "1.5", "(0, 1)"), ("--clip-eps", "-0.5", "(0, 1)"), ("--kl-coef", "inf", "finite"),
    ("--kl-coef", "-1", "must not be negative"), ("--temperature", "inf", "finite"),
    ("--learning-rate", "inf", "finite"), ("--learning-rate", "nan", "finite"), ("--weight-decay", "-0.1", "negative"),
    ("--seed", str(2**70), "--seed"), ("--seed", "-1", "--seed"), ("--plot-every", "-1", "negative"),
    ("--keep-checkpoints", "-1", "negative"),
    ("--device", "meta", "cpu or cuda"), ("--device", "mps", "cpu or cuda"),
])
def test_flag_values_that_would_train_wrong_are_refused(model_dir, gsm8k_dir, tmp_path, capsys, flag, value, message):
    out = tmp_path / "run"
    clips = ["--ppo-epochs", "2"] if flag.startswith("--clip") else []       # with one epoch the clip is idle
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, *clips, flag, value), capsys)
    assert code == 2 and message in err and not out.exists(), err


# ----- 6. data that cannot train is refused when loaded -----

@pytest.mark.parametrize("rows, message", [
    ([{"question": p["question"], "answer": "no marker"} for p in PROBLEMS], "gold answers give no number"),
    ([{"question": p["question"], "answer": "#### 1,2,3"} for p in PROBLEMS], "gold answers give no number"),
    ([{"prompt": p["question"], "answer": p["answer"]} for p in PROBLEMS], "no 'question' column"),
    ([{"question": p["question"], "solution": p["answer"]} for p in PROBLEMS], "no 'answer' column"),
    ([{"question": None, "answer": p["answer"]} for p in PROBLEMS], "questions are not text"),
])
def test_data_that_cannot_train_is_one_line(model_dir, tmp_path, capsys, rows, message):
    data = gh.write_hub_dataset(tmp_path / "data", {"train": rows, "test": rows[:4]})
    out = tmp_path / "run"
    code, err = main_err(tiny_args(model_dir, data, out), capsys)
    assert code == 2 and message in err and not out.exists(), err


def test_a_few_unparsable_golds_are_dropped_with_a_warning_and_numeric_golds_are_read(capsys):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(199)] + [{"question": "q", "answer": "?"}]
    questions, golds, _ = gh.checked_problems(rows, "data")
    assert len(golds) == 199 and golds[5] == 5.0 and "dropped 1 of 200" in capsys.readouterr().err
    assert gh.checked_problems([{"question": "q", "answer": 7}], "data")[1] == [7.0]


# ----- 7. one folder, one run -----

def test_two_runs_started_together_on_one_folder_do_not_interleave(model_dir, gsm8k_dir, tmp_path):
    out = tmp_path / "run"
    procs = [start_cli(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "2")) for _ in range(2)]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "another run is using" in loser or "already holds a run" in loser
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


# ----- 8. what used to be tracebacks is one line -----

def test_damaged_or_foreign_inputs_are_one_line(model_dir, gsm8k_dir, run_copy, tmp_path, capsys, monkeypatch):
    broken = shutil.copytree(model_dir, tmp_path / "broken-model")
    (broken / "model.safetensors").write_bytes(b"\x00" * 100)
    code, err = main_err(tiny_args(broken, gsm8k_dir, tmp_path / "r1"), capsys)
    assert code == 2 and "cannot load model" in err and not (tmp_path / "r1").exists()

    code, err = main_err(["--resume", run_copy, "--output-dir", tmp_path / "elsewhere"], capsys)
    assert code == 2 and "leave out --output-dir" in err

    saved = json.loads((run_copy / "config.json").read_text())
    (run_copy / "config.json").write_text(json.dumps({**saved, "config": {**saved["config"], "new_knob": 1}}))
    assert "unknown setting" in main_err(["--resume", run_copy], capsys)[1]
    (run_copy / "config.json").write_text(json.dumps({**saved, "config": {**saved["config"], "parallel": "ddp"}}))
    assert "unknown setting(s) parallel" in main_err(["--resume", run_copy], capsys)[1]      # an earlier version's
    (run_copy / "config.json").write_text("{torn")       # damaged, and said so (#24: not "not a run directory")
    assert "config.json (damaged?)" in main_err(["--resume", run_copy], capsys)[1]

    for world_size in ("2", "two"):         # torchrun's N copies would race for one run folder
        monkeypatch.setenv("WORLD_SIZE", world_size)
        code, err = main_err(tiny_args(model_dir, gsm8k_dir, tmp_path / "r2"), capsys)
        assert code == 2 and "run it with python, not torchrun" in err and not (tmp_path / "r2").exists()
    monkeypatch.delenv("WORLD_SIZE")


def test_a_half_written_last_metrics_line_is_dropped_on_resume(run_copy, capsys):
    with open(run_copy / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')
    assert gh.main(["--resume", str(run_copy), "--max-steps", "3"]) == 0
    assert "half-written last line" in capsys.readouterr().err
    assert [json.loads(x)["step"] for x in (run_copy / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_finished_run_is_not_resumed_without_more_steps(run_copy, capsys):
    code, err = main_err(["--resume", run_copy], capsys)
    assert code == 2 and "finished after 2 steps" in err


def test_resume_refuses_flags_that_change_what_the_run_learns(run_copy, capsys):
    config = (run_copy / "config.json").read_text()
    for flag, value in (("--group-size", "2"), ("--task", "arithmetic"), ("--learning-rate", "0.1")):
        code, err = main_err(["--resume", run_copy, flag, value, "--max-steps", "3"], capsys)
        assert code == 2 and f"--resume cannot change {flag}" in err
    assert (run_copy / "config.json").read_text() == config


def test_lr_decay_follows_its_line_to_the_last_step_and_resume_cannot_move_its_end(model_dir, gsm8k_dir, tmp_path,
                                                                                  capsys):
    """The last step is the data's end (8 problems / batch 2 = 4 steps), well before --max-steps 200."""
    out = tmp_path / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--lr-warmup-steps", "1", "--lr-decay")) == 0
    lrs = [json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([1e-3, 1e-3, 1e-3 * 2 / 3, 1e-3 / 3])      # tiny_args trains at lr 1e-3
    code, err = main_err(["--resume", out, "--max-steps", "6"], capsys)
    assert code == 2 and "--resume cannot change --max-steps" in err
    code, err = main_err(["--resume", out, "--num-epochs", "2"], capsys)
    assert code == 2 and "--resume cannot change --num-epochs" in err
    code, err = main_err(["--resume", out], capsys)
    assert code == 2 and "--lr-decay schedule ended there" in err and "--max-steps" not in err
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, tmp_path / "r2", "--max-steps", "0", "--lr-decay"), capsys)
    assert code == 2 and "--lr-decay (on in --demo) needs --max-steps" in err and not (tmp_path / "r2").exists()
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, tmp_path / "r3", "--lr-warmup-steps", "4", "--lr-decay"),
                         capsys)                       # the data's 4 steps end within the warm-up
    assert code == 2 and "ends after 4 steps, within --lr-warmup-steps 4" in err and not (tmp_path / "r3").exists()
    code, err = main_err(["--demo", "--max-steps", "0", "--output-dir", tmp_path / "d"], capsys)
    assert code == 2 and "--no-lr-decay turns it off" in err and not (tmp_path / "d").exists()


def test_lr_decay_is_refused_where_signal_filling_may_end_the_data_before_the_decay(model_dir, gsm8k_dir, tmp_path,
                                                                                   capsys):
    """A filled step draws 1 to 1 + --max-draws batches, so 4 batches of data may end the run at any of steps 1-4:
    a decay to --max-steps 3 is refused at 4 further draws, and runs to its end where the data covers 3 steps even
    at the most draws (--max-draws 0)."""
    decay = ("--lr-decay", "--max-steps", "3", "--min-signal-groups", "2")
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, tmp_path / "r", *decay, step_per_batch=False), capsys)
    assert code == 2 and "a step draws 1 to 5 batches" in err and "--max-steps 3" in err
    assert not (tmp_path / "r").exists()
    out = tmp_path / "fits"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, *decay, "--max-draws", "0", step_per_batch=False)) == 0
    lrs = [json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([1e-3, 1e-3 * 2 / 3, 1e-3 / 3])


def test_modes_refuse_flags_they_would_ignore(model_dir, run_copy, capsys):
    assert "leave out MODEL_PATH" in main_err(["--demo", model_dir], capsys)[1]
    assert "takes no other flags" in main_err(["--report", run_copy, "--group-size", "4"], capsys)[1]


def test_chat_prompts_without_a_chat_template_are_refused(model_dir, gsm8k_dir, tmp_path, capsys):
    plain = shutil.copytree(model_dir, tmp_path / "no-template")
    for name in ("chat_template.jinja",):
        (plain / name).unlink(missing_ok=True)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    code, err = main_err(tiny_args(plain, gsm8k_dir, tmp_path / "run"), capsys)
    assert code == 2 and "--prompt-style plain" in err and not (tmp_path / "run").exists()


# ----- 9. --report writes only regular files inside the run folder -----

def test_report_never_writes_through_a_symlink_and_names_damage(run_copy, tmp_path, capsys):
    outside = tmp_path / "outside.md"
    outside.write_text("mine")
    (run_copy / "report_draft.md").unlink()
    (run_copy / "report_draft.md").symlink_to(outside)
    code, err = main_err(["--report", run_copy], capsys)
    assert code == 2 and "not a regular file" in err and outside.read_text() == "mine"

    (run_copy / "report_draft.md").unlink()
    (run_copy / "report_draft.md.tmp").mkdir()           # not this run's: drawn elsewhere first, it stays untouched
    code, err = main_err(["--report", run_copy], capsys)
    assert code == 0 and (run_copy / "report_draft.md.tmp").is_dir() and (run_copy / "report_draft.md").is_file()
    (run_copy / "report_draft.md.tmp").rmdir()

    shutil.rmtree(run_copy / "plots")
    (tmp_path / "elsewhere").mkdir()
    (run_copy / "plots").symlink_to(tmp_path / "elsewhere")
    assert main_err(["--report", run_copy], capsys)[0] == 2 and not list((tmp_path / "elsewhere").iterdir())

    (run_copy / "plots").unlink()
    (run_copy / "summary.json").write_text("[1, 2")
    code, err = main_err(["--report", run_copy], capsys)
    assert code == 2 and "summary.json" in err
    (run_copy / "summary.json").write_text("{}")
    (run_copy / "metrics.jsonl").write_text('{"step": 1}\n')
    code, err = main_err(["--report", run_copy], capsys)
    assert code == 2 and "damaged" in err


# ----- the second hostile review -----

def test_no_path_a_run_writes_is_written_through_a_symlink(run_copy, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    (run_copy / "final.tmp").symlink_to(victim)
    code, err = main_err(["--resume", run_copy, "--max-steps", "3"], capsys)
    assert code == 2 and "final.tmp is not a folder of this run" in err
    assert [p.name for p in victim.iterdir()] == ["keep.txt"] and (victim / "keep.txt").read_text() == "mine"
    (run_copy / "final.tmp").unlink()
    (run_copy / "checkpoints" / "step-4.tmp").symlink_to(victim)
    code, err = main_err(["--resume", run_copy, "--max-steps", "4"], capsys)
    assert code == 2 and "step-4.tmp is not a folder of this run" in err and len(list(victim.iterdir())) == 1
    (run_copy / "checkpoints" / "step-4.tmp").unlink()
    (run_copy / "run.lock").unlink()
    (run_copy / "run.lock").symlink_to(tmp_path / "created-by-the-lock")
    code, err = main_err(["--resume", run_copy, "--max-steps", "5"], capsys)
    assert code == 2 and "cannot use --output-dir" in err and not (tmp_path / "created-by-the-lock").exists()


def test_a_finished_run_whose_checkpoints_were_deleted_is_never_retrained_over(run_copy, capsys):
    shutil.rmtree(run_copy / "checkpoints")
    before = {name: (run_copy / name).read_bytes() for name in ("metrics.jsonl", "summary.json")}
    final = (run_copy / "final" / "model.safetensors").read_bytes()
    code, err = main_err(["--resume", run_copy, "--max-steps", "3"], capsys)
    assert code == 2 and "no checkpoint left" in err and str(run_copy / "final") in err
    assert {name: (run_copy / name).read_bytes() for name in before} == before
    assert (run_copy / "final" / "model.safetensors").read_bytes() == final


def test_an_empty_run_dir_is_refused_not_read_as_no_resume(model_dir, tmp_path, capsys):
    for args in (["--resume", ""], ["--resume", "", model_dir, "--output-dir", tmp_path / "new"], ["--report", ""]):
        code, err = main_err(args, capsys)
        assert code == 2 and "needs a RUN_DIR (it is empty)" in err
    assert not (tmp_path / "new").exists()


def test_ctrl_c_before_the_record_is_complete_leaves_a_run_that_resume_finishes(model_dir, gsm8k_dir, tmp_path,
                                                                                 capsys, monkeypatch):
    out = tmp_path / "run"
    real = gh.write_report_draft
    monkeypatch.setattr(gh, "write_report_draft", lambda run_dir: (_ for _ in ()).throw(KeyboardInterrupt))
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1"), capsys)
    assert code == 2 and f"--resume {out}" in err
    assert json.loads((out / "summary.json").read_text())["finished"] is False
    monkeypatch.setattr(gh, "write_report_draft", real)
    assert gh.main(["--resume", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["finished"] and (out / "report_draft.md").exists()


def test_a_failed_first_write_of_the_config_leaves_nothing_behind(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                   monkeypatch):
    out = tmp_path / "run"
    real = os.replace

    def disk_full_for_the_config(src, dst):
        if str(dst).endswith("config.json"):
            raise OSError(28, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(os, "replace", disk_full_for_the_config)
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1"), capsys)
    assert code == 2 and "run the same command again" in err and not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--advantage-eps", "1e300"], "--advantage-eps must be a finite number (in float32"),
    (["--format-reward", "1e39"], "--format-reward must be a finite number (in float32"),
    (["--group-size", str(2**64)], "--group-size is too large"),
    (["--dataset", ""], "--task gsm8k has no generated problems: pass --dataset"),
    (["--task", "arithmetic", "--train-size", "2001"], "only 2000 generated train problems"),
    (["--task", "arithmetic", "--eval-size", "201"], "only 200 generated test problems"),
    (["--output-dir", "{tmp}/" + os.fsdecode(b"run-\xff")], "--output-dir must be a UTF-8 path"),
    (["--output-dir", "{tmp}/" + "d" * 250 + "/run"], "--output-dir is too long"),
    (["--output-dir", "{tmp}/" + "/".join(["d" * 150] * 26)], "--output-dir is too long"),
])
def test_values_that_overflow_or_ask_for_missing_data_are_one_line(model_dir, tmp_path, capsys, flags, message):
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    code, err = main_err([model_dir, "--output-dir", tmp_path / "run", "--device", "cpu", *flags], capsys)
    assert code == 2 and message in err, err
    assert not list(tmp_path.iterdir())                                     # nothing was made


@pytest.mark.parametrize("line", [b"{}", b"null", b'{"step": "1"}', b'{"step": -1}', b"\xff\xfe not text"])
def test_a_metrics_row_that_is_not_a_step_record_is_one_line_on_resume(run_copy, capsys, line):
    metrics = run_copy / "metrics.jsonl"
    metrics.write_bytes(line + b"\n" + metrics.read_bytes())
    code, err = main_err(["--resume", run_copy, "--max-steps", "3"], capsys)
    assert code == 2 and "metrics.jsonl" in err and ("not a step record" in err or "damaged" in err), err


@pytest.mark.parametrize("key, value", [("step", "abc"), ("step", -5), ("optimizer", {"items": []}),
                                        ("rng", [{"items": []}])])
def test_a_hand_edited_trainer_state_is_one_line(run_copy, capsys, key, value):
    path = run_copy / "checkpoints" / "step-2" / "trainer_state.json"
    state = json.loads(path.read_text())
    state["items"] = [[k, value if k == key else v] for k, v in state["items"]]
    path.write_text(json.dumps(state))
    code, err = main_err(["--resume", run_copy, "--max-steps", "3"], capsys)
    assert code == 2 and "cannot read checkpoint" in err
    assert json.loads((run_copy / "summary.json").read_text())["steps"] == 2       # nothing was replaced


@pytest.mark.parametrize("field, value", [("task", "chess"), ("dtype", "float8"), ("advantage", "ppo")])
def test_a_saved_config_is_validated_like_the_command_line(run_copy, capsys, field, value):
    saved = json.loads((run_copy / "config.json").read_text())
    saved["config"][field] = value
    (run_copy / "config.json").write_text(json.dumps(saved))
    code, err = main_err(["--resume", run_copy, "--max-steps", "3"], capsys)
    assert code == 2 and "must be one of" in err and repr(value) in err


def test_a_failure_that_is_not_an_os_error_is_one_line_with_the_resume_command(model_dir, gsm8k_dir, tmp_path,
                                                                                capsys, monkeypatch):
    out = tmp_path / "run"
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, "--temperature", "1e-300"), capsys)
    assert code == 2 and "--temperature must be at least 0.001" in err and not out.exists()

    def sampling_fails(*args, greedy=gh.generate_completions, **kwargs):     # evaluation (greedy) still runs
        if kwargs.get("temperature") == 0.0:
            return greedy(*args, **kwargs)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(gh, "generate_completions", sampling_fails)
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1"), capsys)
    assert code == 2 and "failed (CUDA error: an illegal" in err and "during training; resume with" in err


def test_a_failure_of_a_library_s_own_kind_while_saving_is_one_line_with_the_resume_command(
        model_dir, gsm8k_dir, tmp_path, capsys, monkeypatch):
    class SafetensorError(Exception):                 # safetensors' own error on a full disk is no OSError
        pass
    out = tmp_path / "run"
    real_save = gh.save_model

    def disk_full_at_final(path, *args, **kwargs):      # the checkpoint before it is written, as after any step
        if path.name == "final.tmp":
            raise SafetensorError("No space left")
        return real_save(path, *args, **kwargs)
    monkeypatch.setattr(gh, "save_model", disk_full_at_final)
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1"), capsys)
    assert code == 2 and "failed (No space left) during the final evaluation and save" in err
    assert f"--resume {out}" in err


def test_report_on_records_that_block_overflow_or_cannot_be_written_or_a_live_run_is_one_line(
        run_copy, capsys, monkeypatch):
    import fcntl
    (run_copy / "eval_after.jsonl").unlink()
    os.mkfifo(run_copy / "eval_after.jsonl")             # reading it would wait for a writer forever
    assert "eval_after.jsonl is not a regular file" in main_err(["--report", run_copy], capsys)[1]
    (run_copy / "eval_after.jsonl").unlink()
    (run_copy / "eval_after.jsonl").mkdir()
    assert "eval_after.jsonl is not a regular file" in main_err(["--report", run_copy], capsys)[1]
    (run_copy / "eval_after.jsonl").rmdir()
    summary = json.loads((run_copy / "summary.json").read_text())
    (run_copy / "summary.json").write_text(json.dumps({**summary, "accuracy_before": 10**400}))
    assert "damaged (OverflowError" in main_err(["--report", run_copy], capsys)[1]
    (run_copy / "summary.json").write_text(json.dumps(summary))

    real = os.replace
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    code, err = main_err(["--report", run_copy], capsys)       # a read-only folder (root ignores chmod)
    assert code == 2 and "cannot write there (Permission denied)" in err
    monkeypatch.setattr(os, "replace", real)

    lock = os.open(run_copy / "run.lock", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)                           # the run is live: its plots are being redrawn
    try:
        code, err = main_err(["--report", run_copy], capsys)
    finally:
        os.close(lock)
    assert code == 2 and "another run is using" in err
    assert main_err(["--report", run_copy], capsys)[0] == 0


def test_ctrl_c_while_the_libraries_load_is_one_line():
    proc = start_cli(["--help"])
    time.sleep(0.5)                                   # within torch's import, which takes seconds on these machines
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "Traceback" not in err and err.strip().startswith("error: interrupted"), err


def test_ctrl_c_while_the_flags_are_read_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(gh, "parse_config", interrupted)
    code = gh.main(["model", "--output-dir", str(tmp_path / "run")])
    assert (code, capsys.readouterr().err) == (2, "error: interrupted before the run began; nothing was written\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("empty, message", [("test", "split 'test[:4]' of {data} has no rows"),
                                            ("train", "cannot load the splits of {data} (a split with no rows?)")])
def test_an_empty_split_is_named_with_its_cause(model_dir, tmp_path, capsys, empty, message):
    data = gh.write_hub_dataset(tmp_path / "data", {"train": PROBLEMS, "test": PROBLEMS[:4], empty: []})
    code, err = main_err([model_dir, "--dataset", data, "--eval-size", "4", "--output-dir", tmp_path / "run",
                          "--device", "cpu"], capsys)
    assert code == 2 and message.format(data=data) in err, err


# ----- extraction: a number is a whole token -----

@pytest.mark.parametrize("text, number", [("#### 1,2,3", None), ("#### 3/4", None), ("#### 1e309", None),
                                          ("#### 1" + "0" * 400, None), ("#### 12kg", None), ("#### 1,234.", 1234.0),
                                          ("#### $-5", -5.0), ("\\boxed{42}", 42.0), ("The answer is: **18**.", 18.0)])
def test_a_number_is_the_whole_token_after_the_marker(text, number):
    assert gh.extract_answer_from_completion(text) == number


def test_the_format_bonus_needs_a_number_on_the_answer_line():
    assert gh.final_line_answer("so\n#### 42") is not None
    assert gh.final_line_answer("#### " + "9" * 100_000) is None
    rewards = gh.compute_reward(["#### " + "9" * 100_000, "#### 3/4", "#### 7"], [1.0, 1.0, 7.0], format_reward=0.1)
    assert rewards.tolist() == pytest.approx([0.0, 0.0, 1.1])
    assert math.isclose(gh.GSM8KDataset.extract_answer("x\n#### 2,000"), 2000.0)


# ----- round 3 (#48): what users do to a run -----

def hub_folder_without_readme(path, splits):
    """What `hf download openai/gsm8k --include "main/*"` leaves: main/*.parquet and no README.md."""
    gh.write_hub_dataset(path, splits)
    (path / "README.md").unlink()
    return path


def test_a_hub_layout_without_its_readme_and_plain_split_files_load(tmp_path, tokenizer):
    bare = hub_folder_without_readme(tmp_path / "bare", {"train": PROBLEMS, "test": PROBLEMS[:4]})
    assert gh.GSM8KDataset("test[:2]", tokenizer, dataset_path=str(bare)).answers == [7.0, 60.0]
    plain = tmp_path / "plain"
    plain.mkdir()
    from datasets import Dataset
    Dataset.from_list(PROBLEMS).to_json(str(plain / "train.jsonl"))
    Dataset.from_list(PROBLEMS[4:]).to_json(str(plain / "test.jsonl"))
    assert gh.GSM8KDataset("test", tokenizer, dataset_path=str(plain)).answers == [42.0, 5.0, 6.0, 150.0]
    assert len(gh.GSM8KDataset("train", tokenizer, dataset_path=str(plain))) == 8


@pytest.mark.skipif(not SHARED_GSM8K.is_dir(), reason="needs GSM8K in ../shared/gsm8k")
def test_real_gsm8k_as_the_readme_download_leaves_it_loads(tmp_path):
    bare = tmp_path / "gsm8k"
    shutil.copytree(SHARED_GSM8K / "main", bare / "main")        # exactly main/{train,test}-00000-of-00001.parquet
    test = gh.GSM8KDataset("test", None, dataset_path=str(bare))
    assert len(test) == 1319 and test.answers[0] == 18.0 and test.questions[0].startswith("Janet")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_after_the_step_checkpoint_and_resume_keeps_every_row(model_dir, gsm8k_dir, tmp_path,
                                                                                      capsys, name):
    out = tmp_path / "run"
    proc = start_cli(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "500", "--num-epochs", "200"))
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
        time.sleep(0.2)
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert f"{name}: stopping after this step" in err
    assert err.strip().splitlines()[-1] == f"error: interrupted during training; resume with: python " \
                                           f"grpo_homework.py --resume {out}"
    steps = len((out / "metrics.jsonl").read_text().splitlines())
    assert (out / "checkpoints" / f"step-{steps}" / "trainer_state.safetensors").exists()
    assert gh.main(["--resume", str(out), "--max-steps", str(steps + 1)]) == 0, capsys.readouterr().err[-2000:]
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, steps + 2))


def failing_call(monkeypatch, name, on_call, error, when=lambda *a, **k: True):
    """Make gh.<name> raise `error` on its `on_call`-th call that `when` selects."""
    real, calls = getattr(gh, name), []

    def wrapped(*args, **kwargs):
        if when(*args, **kwargs):
            calls.append(1)
            if len(calls) == on_call:
                raise error
        return real(*args, **kwargs)
    monkeypatch.setattr(gh, name, wrapped)


def fail_sampling(monkeypatch, on_call, message):
    """gh.generate_completions raises a CUDA-style error on its on_call-th sampling call (greedy evaluations pass)."""
    sampling = lambda *args, **kwargs: (args[5] if len(args) > 5 else kwargs["temperature"]) > 0
    failing_call(monkeypatch, "generate_completions", on_call, RuntimeError(message), sampling)


def varied(completions, golds, **kwargs):
    """A reward that varies with the text: a random model's groups then have spread, so the weights move."""
    return torch.tensor([float(sum(map(ord, c)) % 2) for c in completions])


def whole_and_broken(model_dir, gsm8k_dir, tmp_path, capsys, monkeypatch, steps, break_run):
    """Train `steps` steps twice with a reward that moves the weights: whole, then with break_run(patch) applied.
    Returns the two folders and the broken run's exit code and stderr."""
    monkeypatch.setattr(gh, "compute_reward", varied)
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, whole, "--max-steps", str(steps))) == 0
    with monkeypatch.context() as patch:
        break_run(patch)
        code, err = main_err(tiny_args(model_dir, gsm8k_dir, broken, "--max-steps", str(steps)), capsys)
    return whole, broken, code, err


def resume_ends_as_the_whole_run(whole, broken):
    """--resume finishes the broken run with final weights equal, bit for bit, to the whole run's."""
    assert gh.main(["--resume", str(broken)]) == 0
    a, b = (load_file(run / "final" / "model.safetensors") for run in (whole, broken))
    assert all(torch.equal(a[k], b[k]) for k in a)
    return a


def test_a_failure_mid_step_checkpoints_the_last_step_and_resume_ends_bit_identical(model_dir, gsm8k_dir, tmp_path,
                                                                                    capsys, monkeypatch):
    whole, failed, code, err = whole_and_broken(
        model_dir, gsm8k_dir, tmp_path, capsys, monkeypatch, 4,
        lambda patch: fail_sampling(patch, 3, "CUDA error: an illegal memory access"))
    assert code == 2 and err.startswith("error: failed (CUDA error: an illegal memory access) during training; "
                                        "resume with: python") and err.endswith(f" --resume {failed}"), err
    assert [p.name for p in (failed / "checkpoints").iterdir()] == ["step-2"]       # --save-every was 0
    trained = resume_ends_as_the_whole_run(whole, failed)           # the random streams as step 2 left them
    start = load_file(model_dir / "model.safetensors")
    assert any(not torch.equal(trained[k], start[k]) for k in trained)   # and the steps did move the weights


def ctrl_c_as_the_last_checkpoint_is_written(patch):
    real_save = gh.save_checkpoint
    patch.setattr(gh, "save_checkpoint", lambda *a, **k: os.kill(os.getpid(), signal.SIGINT) or real_save(*a, **k))


def a_closed_pipe_at_the_end(patch):
    """stdout a pipe its reader closed (PYTHONUNBUFFERED=1 ... | head)."""
    import builtins
    real_print = builtins.print

    def closed_pipe(*args, **kwargs):
        if args[:1] == ("Training completed!",):
            raise BrokenPipeError(32, "Broken pipe")
        return real_print(*args, **kwargs)
    patch.setattr(builtins, "print", closed_pipe)


@pytest.mark.parametrize("stop", [ctrl_c_as_the_last_checkpoint_is_written, a_closed_pipe_at_the_end])
def test_a_stop_right_after_training_loses_no_step(model_dir, gsm8k_dir, tmp_path, capsys, monkeypatch, stop):
    """--save-every 0: the checkpoint of the last step is written before 'Training completed!' is printed, still
    under the stop-after-this-step protection; a resume then evaluates and ends as the uninterrupted run did."""
    whole, stopped, code, err = whole_and_broken(model_dir, gsm8k_dir, tmp_path, capsys, monkeypatch, 2, stop)
    assert code == 2 and err.endswith(f"--resume {stopped}"), err
    assert [p.name for p in (stopped / "checkpoints").iterdir()] == ["step-2"]
    resume_ends_as_the_whole_run(whole, stopped)
    assert "no checkpoint yet" not in capsys.readouterr().err
    assert [json.loads(x)["step"] for x in (stopped / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_run_restarted_from_step_0_repeats_the_uninterrupted_run(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                   monkeypatch):
    """A failure in step 1 leaves no checkpoint: --resume keeps the evaluation before and trains from step 0. The
    evaluation draws nothing from the random streams the sampler uses, so the two runs end equal."""
    whole, failed, code, err = whole_and_broken(
        model_dir, gsm8k_dir, tmp_path, capsys, monkeypatch, 2,
        lambda patch: fail_sampling(patch, 1, "CUDA error: launch failure"))
    assert code == 2 and not (failed / "checkpoints").exists() and (failed / "eval_before.jsonl").exists()
    resume_ends_as_the_whole_run(whole, failed)
    assert "no checkpoint yet: training starts at step 0" in capsys.readouterr().err


def test_evaluation_leaves_the_global_random_stream_where_it_was(model_and_tokenizer, gsm8k_dir):
    model, tok = model_and_tokenizer
    data = gh.GSM8KDataset("test", tok, dataset_path=str(gsm8k_dir))
    torch.manual_seed(7)
    state = torch.get_rng_state()
    gh.evaluate(model, tok, data, gh.RunConfig(max_new_tokens=3, eval_batch_size=2), torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)


def test_a_failure_inside_the_optimizer_update_writes_no_checkpoint(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.setattr(gh, "compute_reward", varied)
    out = tmp_path / "run"
    real_step = gh.AdamWStochasticRounding.step

    def step(self, *args):
        real_step(self, *args)
        if self.state_dict()["state"][0]["step"] == 2:       # the weights are half-updated: nothing safe to save
            raise RuntimeError("device-side assert triggered")
    monkeypatch.setattr(gh.AdamWStochasticRounding, "step", step)
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "4"), capsys)
    assert code == 2 and "device-side assert" in err and not (out / "checkpoints").exists()


def run_in(folder, args, monkeypatch):
    monkeypatch.chdir(folder)
    return gh.main([str(a) for a in args])


def test_a_resume_refuses_data_or_a_model_that_changed_and_works_from_another_folder(model_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    gh.write_hub_dataset(work / "gsm8k", {"train": PROBLEMS, "test": PROBLEMS[:4]})
    shutil.copytree(model_dir, work / "model")
    args = lambda out, *extra: tiny_args("./model", "./gsm8k", out, "--save-every", "1", "--max-steps", "1", *extra)
    assert run_in(work, args("run"), monkeypatch) == 0
    record = json.loads((work / "run" / "config.json").read_text())
    assert record["config"]["dataset"] == str(work / "gsm8k") and record["config"]["model_path"] == str(work / "model")
    assert set(record["inputs"]) == {"train", "eval", "model"}
    # the test rows reordered: report_draft.md would pair one problem's answer with another's
    gh.write_hub_dataset(work / "gsm8k", {"train": PROBLEMS, "test": PROBLEMS[:4][::-1]})
    code, err = main_err(["--resume", work / "run", "--max-steps", "2"], capsys)
    assert code == 2 and err == f"error: --resume {work / 'run'}: the evaluation problems of {work / 'gsm8k'} " \
                                f"changed since the run began (their fingerprint differs): put them back as they " \
                                f"were, or start a new run"
    gh.write_hub_dataset(work / "gsm8k", {"train": PROBLEMS, "test": PROBLEMS[:4]})
    assert run_in(elsewhere, ["--resume", work / "run", "--max-steps", "2"], monkeypatch) == 0   # paths are absolute
    # a KL run reads the starting model again on resume: a replaced model folder is refused
    assert run_in(work, args("kl", "--kl-coef", "0.1"), monkeypatch) == 0
    model = gh.load_model_and_tokenizer(str(work / "model"), torch.device("cpu"), "float32")[0]
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    model.save_pretrained(work / "model")
    code, err = main_err(["--resume", work / "kl", "--max-steps", "2"], capsys)
    assert code == 2 and f"the model folder {work / 'model'} changed since the run began" in err
    assert json.loads((work / "kl" / "summary.json").read_text())["steps"] == 1


def test_report_draft_never_pairs_records_of_different_problems(run_copy, capsys):
    records = (run_copy / "eval_after.jsonl").read_text().splitlines()
    (run_copy / "eval_after.jsonl").write_text("\n".join(records[::-1]) + "\n")
    code, err = main_err(["--report", run_copy], capsys)
    assert code == 2 and "holds other problems than the evaluation after training" in err


def tiny_model(config_class, **extra):
    import transformers
    config = getattr(transformers, config_class)(**{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                                                    "num_hidden_layers": 1, "num_attention_heads": 2, **extra})
    return transformers.AutoModelForCausalLM.from_config(config)


def test_a_model_with_an_lm_head_bias_trains_through_the_cli(tokenizer, gsm8k_dir, tmp_path):
    """TODO 4 scores a model's own logits (tests/test_grpo.py checks their values on Phi, Gemma 2 and Cohere), so a
    model whose logits are not hidden @ head, such as Phi's with its LM-head bias, is no longer refused: it trains
    and finishes with its record (the CLI refused it before 2026-11-26)."""
    tiny_model("PhiConfig", vocab_size=len(tokenizer)).save_pretrained(tmp_path / "phi")
    tokenizer.save_pretrained(tmp_path / "phi")
    assert gh.main(tiny_args(tmp_path / "phi", gsm8k_dir, tmp_path / "run", "--max-steps", "1")) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 1


def test_a_checkpoint_from_a_gpu_resumes_on_a_cpu(run_copy, capsys):
    """A CUDA run's random streams (cuda, the rounding noise of cuda:0) cannot continue on a CPU: they are left."""
    from safetensors.torch import save_file
    checkpoint = run_copy / "checkpoints" / "step-2"
    state = gh.load_trainer_state(checkpoint)
    for rng in state["rng"]:
        cuda_state = torch.zeros(16, dtype=torch.uint8)        # a CUDA generator's state is 16 bytes
        rng["cuda"], rng["rounding"] = cuda_state, {"cuda:0": cuda_state.clone()}
    tensors = {}
    (checkpoint / gh.TRAINER_STATE[0]).write_text(json.dumps(gh.to_plain(state, tensors)))
    save_file(tensors, checkpoint / gh.TRAINER_STATE[1])
    assert gh.main(["--resume", str(run_copy), "--max-steps", "3", "--device", "cpu"]) == 0, capsys.readouterr().err


def test_a_failure_while_loading_a_resume_does_not_repeat_the_command(run_copy, capsys):
    (run_copy / "checkpoints" / "step-2" / "model.safetensors").write_bytes(b"\0" * 64)
    code, err = main_err(["--resume", run_copy, "--max-steps", "3"], capsys)
    assert code == 2 and "cannot load model" in err and "resume with" not in err


def test_a_chat_template_without_a_system_role_gets_the_instruction_in_the_user_turn(tokenizer):
    strict = copy.deepcopy(tokenizer)
    strict.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role "
                            "not supported') }}{% endif %}<u>{{ m['content'] }}</u>{% endfor %}")
    assert gh.build_prompt("What is 2 + 3?", strict, "chat") == f"<u>{gh.GSM8K_INSTRUCTION}\n\nWhat is 2 + 3?</u>"


def test_plain_prompts_keep_the_instruction_of_tasks_other_than_gsm8k():
    assert gh.build_prompt("Q?") == "Question: Q?\nAnswer: Let's solve this step by step.\n"     # the template's
    generated = gh.build_prompt("Q?", None, "plain", gh.HASH_INSTRUCTION)
    assert generated.startswith(gh.HASH_INSTRUCTION) and "'#### <number>'" in generated and generated.endswith(
        "Question: Q?\nAnswer: Let's solve this step by step.\n")


def test_a_few_empty_questions_are_dropped_like_bad_golds(capsys):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(199)] + [{"question": " ", "answer": "#### 1"}]
    questions, golds, _ = gh.checked_problems(rows, "data")
    assert len(questions) == 199 and "dropped 1 of 200 problems whose question is empty" in capsys.readouterr().err


def test_report_draft_shows_whole_answers_in_fences_and_prints_whole_golds(tmp_path):
    """Markup in a question or an answer (HTML, $, |, *, a run of backticks) is shown as written inside a code
    fence that nothing in it closes, so a viewer renders none of it; the gold and the answer read print whole."""
    long = "step " * 400 + "so the answer is $<b>18</b>$ \\boxed{18} ```"
    record = {"question": "Janet's *ducks* cost $2 | $3?", "gold": 18.0, "tokens": 9, "truncated": False,
              "well_formed": True}
    gh.write_jsonl(tmp_path / "eval_before.jsonl", [{**record, "completion": "no idea", "extracted": None,
                                                      "correct": False}])
    gh.write_jsonl(tmp_path / "eval_after.jsonl", [{**record, "completion": long, "extracted": 18.0, "correct": True}])
    text = gh.write_report_draft(tmp_path).read_text()
    assert f"\n````text\n{long}\n````\n" in text and "\n```text\nno idea\n```\n" in text
    assert "\n```text\nJanet's *ducks* cost $2 | $3?\n```\n" in text
    assert "\n#### Line 1 of eval_before.jsonl and eval_after.jsonl: gold 18\n" in text
    assert "\nBefore: 9 tokens, ended; answer read: none, wrong.\n" in text
    assert "\nAfter: 9 tokens, ended; answer read: 18, right.\n" in text


def test_report_on_a_run_stopped_in_its_first_evaluation_says_what_is_missing(run_copy, capsys):
    for name in ("metrics.jsonl", "eval_after.jsonl", "eval_before.jsonl"):
        (run_copy / name).unlink()
    assert main_err(["--report", run_copy], capsys)[0] == 0
    text = (run_copy / "report_draft.md").read_text()
    assert "Missing: the evaluation before training (eval_before.jsonl) and the evaluation after training" in text
    assert "No training step is recorded yet." in text and "Not yet: this needs both evaluations" in text


@pytest.mark.filterwarnings("ignore:No artists with labels")      # the patched plot draws none
def test_plots_of_one_step_show_markers_and_an_unmeasured_entropy_says_so(run_copy, monkeypatch):
    import matplotlib.axes
    drawn, texts = [], []
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda self, x, y, fmt, **k: drawn.append(fmt))
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, x, y, s, **k: texts.append(s))
    row = json.loads((run_copy / "metrics.jsonl").read_text().splitlines()[0])
    (run_copy / "metrics.jsonl").write_text(json.dumps({**row, "entropy": None}) + "\n")
    gh.write_plots(run_copy)
    assert drawn and all("." in fmt for fmt in drawn)
    assert texts == ["not measured: no step ran an update pass\n(every group's rewards were equal)"]


def test_dtype_auto_is_recorded_as_it_resolved_and_an_old_records_auto_resumes_in_float32(model_dir, gsm8k_dir,
                                                                                           run_copy, tmp_path,
                                                                                           monkeypatch):
    """On a CPU that computes bf16, --dtype auto trains in bf16 and config.json says bfloat16, so a resume on another
    machine trains on in bf16 too. A record saying auto was written before auto chose bf16 on CPUs: it trained in
    fp32, and resumes in fp32 (its checkpoint's weights are fp32; loading them as bf16 would round them)."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    out = tmp_path / "auto"
    assert gh.main([str(a) for a in tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1", "--dtype", "auto")]) == 0
    assert json.loads((out / "config.json").read_text())["config"]["dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(out / "final" / "model.safetensors").values()} == {torch.bfloat16}
    record = json.loads((run_copy / "config.json").read_text())        # a 2-step fp32 run with checkpoints
    record["config"]["dtype"] = "auto"
    (run_copy / "config.json").write_text(json.dumps(record))
    shutil.rmtree(run_copy / "checkpoints" / "step-2")
    assert gh.main(["--resume", str(run_copy)]) == 0
    assert json.loads((run_copy / "config.json").read_text())["config"]["dtype"] == "float32"
    assert {t.dtype for t in load_file(run_copy / "final" / "model.safetensors").values()} == {torch.float32}


def test_a_run_whose_training_problems_ran_out_is_finished(model_dir, gsm8k_dir, tmp_path, capsys):
    """With signal filling a step may draw several batches: 8 problems in batches of 2 end after a step or two, well
    before --max-steps 10. A plain --resume must not evaluate and rewrite final/ again (17 minutes on the CPU Qwen
    run), and --max-steps 50 must not print 'Training completed!' after 0 steps: both refuse, naming --num-epochs."""
    out = tmp_path / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "10", "--save-every", "1",
                             step_per_batch=False)) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] < 10 and metrics[-1]["batch_in_epoch"] == 4          # the data ran out first
    written = {p: p.stat().st_mtime_ns for p in (out / "eval_after.jsonl", out / "final" / "model.safetensors")}
    for extra in ([], ["--max-steps", "50"]):
        code, err = main_err(["--resume", out, *extra], capsys)
        assert code == 2 and "its training problems ran out; pass a larger --num-epochs (now 1)" in err, err
    assert all(p.stat().st_mtime_ns == t for p, t in written.items())


def eval_args(model_dir, gsm8k_dir, out, *extra):
    """--eval-only takes only the flags that shape an evaluation (the others would do nothing, and are refused)."""
    return [str(model_dir), "--eval-only", "--dataset", str(gsm8k_dir), "--output-dir", str(out), "--device", "cpu",
            "--eval-size", "4", "--max-new-tokens", "8", "--eval-batch-size", "4", "--dtype", "float32", *extra]


def test_eval_only_scores_a_model_at_its_own_budget_and_trains_nothing(model_dir, gsm8k_dir, tmp_path, capsys):
    """How a saved model (a run's final/, or the starting one) is scored at another --max-new-tokens: one
    evaluation, worded as one and recorded as one; no training problems read, no optimizer; finished, so a resume
    has nothing to do; its report draft holds the scoring alone (--report draws it again, and no plot)."""
    out = tmp_path / "score"
    test_only = gh.write_hub_dataset(tmp_path / "test-only", {"test": PROBLEMS[:4]})    # no train split at all
    assert gh.main(eval_args(model_dir, test_only, out, "--max-new-tokens", "5")) == 0
    printed = capsys.readouterr().out
    assert not any(words in printed for words in ("Setting up optimizer", "before training", "starting model"))
    assert f"Scoring {model_dir} (float32, 5 new tokens) on 4 test problems..." in printed
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "eval.jsonl", "report_draft.md", "run.lock",
                                                     "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["eval_only"] and "accuracy_before" not in summary
    assert summary["scored"] == {"model": str(model_dir), "dtype": "float32", "max_new_tokens": 5,
                                 "problems": "test 0-3"}
    records = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert len(records) == 4 and max(r["tokens"] for r in records) == 5 and any(r["truncated"] for r in records)
    assert summary["accuracy"] == sum(r["correct"] for r in records) / 4
    code, err = main_err(["--resume", out], capsys)
    assert code == 2 and "finished (--eval-only: its scores are in eval.jsonl)" in err
    draft = (out / "report_draft.md").read_text()
    assert f"| {model_dir.name} (float32) | test 0-3 | 5 | {summary['accuracy']:.1%} |" in draft
    assert "nothing trained" in draft and "## 1." not in draft and "## 4." not in draft
    (out / "report_draft.md").unlink()
    assert gh.main(["--report", str(out)]) == 0 and (out / "report_draft.md").read_text() == draft
    assert not (out / "plots").exists()


@pytest.mark.parametrize("saved", ["float32", "bfloat16"])
def test_eval_only_scores_a_float32_folder_in_float32(model_dir, gsm8k_dir, tmp_path, capsys, saved):
    """--dtype auto means bf16 on this CPU (AVX512-BF16 or AMX); a folder saved in fp32 (a LoRA run's merged final/)
    is scored in fp32 all the same, the model training produced, and its record says so."""
    if gh.weight_dtype("auto", torch.device("cpu")) != torch.bfloat16:
        pytest.skip("this CPU computes bf16 slowly: --dtype auto is float32 for every folder")
    folder = tmp_path / "model"
    model, tok = gh.load_model_and_tokenizer(str(model_dir), torch.device("cpu"), saved)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    args = eval_args(folder, gsm8k_dir, tmp_path / "auto")[:-2]
    assert "--dtype" not in args and gh.main(args) == 0
    assert json.loads((tmp_path / "auto" / "summary.json").read_text())["scored"]["dtype"] == saved
    assert gh.main(eval_args(folder, gsm8k_dir, tmp_path / "explicit", "--dtype", saved)) == 0
    assert (tmp_path / "auto" / "eval.jsonl").read_text() == (tmp_path / "explicit" / "eval.jsonl").read_text()


def test_eval_start_scores_test_problems_by_position_and_refuses_ranges_past_the_split(model_dir, gsm8k_dir, tmp_path,
                                                                                         capsys):
    """The untouched-problems evaluation (--eval-start 200 on GSM8K): the fixture's test split has 4 problems."""
    assert gh.main(eval_args(model_dir, gsm8k_dir, tmp_path / "tail", "--eval-start", "2", "--eval-size", "0")) == 0
    records = [json.loads(line) for line in (tmp_path / "tail" / "eval.jsonl").read_text().splitlines()]
    assert [r["question"] for r in records] == [p["question"] for p in PROBLEMS[2:4]]
    assert json.loads((tmp_path / "tail" / "summary.json").read_text())["scored"]["problems"] == "test 2-3"
    for flags, message in [(["--eval-start", "4", "--eval-size", "0"], "has no rows (a start past its end?"),
                           (["--eval-start", "3", "--eval-size", "2"], "there are only 1 test problems"),
                           (["--eval-start", "-1"], "--eval-start must not be negative"),
                           (["--eval-split", "validation", "--val-size", "2", "--eval-start", "1", "--eval-size", "2"],
                            "at least --eval-start + --eval-size")]:
        out = tmp_path / f"refused-{flags[1]}-{flags[-1]}"
        code, err = main_err(eval_args(model_dir, gsm8k_dir, out, *flags), capsys)
        assert code == 2 and message in err and not out.exists(), err


SHORT = ("--max-steps", "1", "--train-size", "4", "--eval-size", "1", "--max-new-tokens", "2", "--batch-size", "2",
         "--group-size", "2", "--generation-batch-size", "2", "--dtype", "float32")   # a regression fails in seconds


@pytest.mark.parametrize("flags, message", [
    (["--eval-only", "--kl-coef", "0.1"], "--kl-coef would do nothing with --eval-only, which trains nothing"),
    (["--eval-only", "--learning-rate", "1e-5", "--lora-rank", "8"],
     "--learning-rate, --lora-rank would do nothing with --eval-only"),
    (["--lora-alpha", "16", *SHORT], "--lora-alpha would do nothing without --lora-rank (full fine-tuning)"),
    (["--lora-targets", "q_proj", *SHORT], "--lora-targets would do nothing without --lora-rank"),
])
def test_flags_that_would_do_nothing_are_refused(model_dir, gsm8k_dir, tmp_path, capsys, flags, message):
    args = [str(model_dir), "--dataset", str(gsm8k_dir), "--output-dir", str(tmp_path / "run"), "--device", "cpu",
            *flags]
    code, err = main_err(args, capsys)
    assert code == 2 and message in err and not (tmp_path / "run").exists(), err


def test_demo_with_eval_only_is_one_line_before_any_work(tmp_path, capsys):
    code, err = main_err(["--demo", "--eval-only", "--output-dir", tmp_path / "demo"], capsys)
    assert code == 2 and "--demo builds its own model, then trains and scores it" in err, err
    assert "leave out --eval-only" in err
    assert not (tmp_path / "demo").exists()


def test_training_short_of_max_steps_because_problems_ran_out_says_so(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                      monkeypatch):
    """8 training problems, 2 a batch: 4 batches. Signal filling (a step draws up to 1 + --max-draws batches until
    --batch-size groups have spread) uses them up in fewer than --max-steps 4 steps."""
    monkeypatch.setattr(gh, "compute_reward", lambda completions, golds, **kw: torch.zeros(len(completions)))
    out = tmp_path / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "4", "--max-draws", "1",
                             step_per_batch=False)) == 0
    err = capsys.readouterr().err
    assert "warning: the training problems ran out after step 2, short of --max-steps 4" in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["problems_ran_out"] is True


def test_resume_with_another_generation_batch_size_warns_that_samples_change(run_copy, capsys):
    assert gh.main(["--resume", str(run_copy), "--max-steps", "3", "--generation-batch-size", "8"]) == 0
    assert "warning: --generation-batch-size 4 -> 8: the samples from here on differ" in capsys.readouterr().err


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, None, "2"])
def test_damaged_saved_values_are_one_line_on_resume(run_copy, capsys, value):
    record = json.loads((run_copy / "config.json").read_text())
    for field in ("min_signal_groups", "parallel"):
        record["config"][field] = value
        (run_copy / "config.json").write_text(json.dumps(record))
        code, err = main_err(["--resume", run_copy], capsys)
        assert code == 2 and str(run_copy / "config.json") in err, err
        del record["config"][field]
    (run_copy / "config.json").write_text(json.dumps({**record, "config": "oops"}))
    code, err = main_err(["--resume", run_copy], capsys)
    assert code == 2 and "no run record (config.json) there, so it is not a run directory" in err, err


def test_resume_with_dtype_auto_keeps_the_recorded_dtype(run_copy, capsys):
    assert gh.main(["--resume", str(run_copy), "--max-steps", "3", "--dtype", "auto"]) == 0
    assert json.loads((run_copy / "config.json").read_text())["config"]["dtype"] == "float32"


def test_resume_with_max_steps_below_the_checkpoint_is_refused(run_copy, capsys):
    summary = json.loads((run_copy / "summary.json").read_text())
    (run_copy / "summary.json").write_text(json.dumps({**summary, "finished": False}))
    code, err = main_err(["--resume", run_copy, "--max-steps", "1"], capsys)
    assert code == 2 and "--max-steps 1: " in err and "is at step 2 already" in err, err


def test_a_run_folder_or_a_file_given_as_model_or_data_is_named(model_dir, gsm8k_dir, run_copy, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "data.parquet").write_bytes(b"x")
    for args, message in [([run_copy, "--dataset", gsm8k_dir], f"is a run folder: its trained model is {run_copy}"),
                          ([model_dir, "--dataset", tmp_path / "data.parquet"], "is a file: pass the folder"),
                          ([model_dir, "--dataset", tmp_path / "empty"], "is empty: put GSM8K in hub layout")]:
        code, err = main_err([*args, "--output-dir", tmp_path / "out", "--device", "cpu"], capsys)
        assert code == 2 and message in err and not (tmp_path / "out").exists(), err


def test_a_generation_batch_whose_kv_cache_cannot_fit_is_refused_before_it_starts(model_dir, gsm8k_dir, tmp_path,
                                                                                  capsys):
    """Else the OS kills the process (exit 137) without a word."""
    code, err = main_err(tiny_args(model_dir, gsm8k_dir, tmp_path / "run", "--group-size", "1000000",
                                   "--generation-batch-size", "1000000"), capsys)
    assert code == 2 and "--generation-batch-size 1000000 x 520 tokens would need a" in err, err
    assert "GiB of memory available" in err and not (tmp_path / "run").exists()


def test_the_gsm8k_runs_analyze_script_reads_odd_records_in_one_line(tmp_path):
    """plots/qwen-gsm8k-b256/analyze.py: no folder or no metrics.jsonl, a torn last line, an empty evaluation, and a
    run whose updates moved nothing (policy_kl 0: no log scale)."""
    run = ROOT / "plots" / "qwen-gsm8k-b256"
    analyze = lambda folder, *extra: subprocess.run([sys.executable, str(run / "analyze.py"), str(folder), *extra],
                                                    capture_output=True, text=True, timeout=120)
    (tmp_path / "no-metrics").mkdir()
    for folder, message in ((tmp_path / "none", "is not a folder"), (tmp_path / "no-metrics", "does not exist")):
        result = analyze(folder)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and message in result.stderr
    torn = tmp_path / "torn"
    torn.mkdir()
    for name in ("summary.json", "eval_before.jsonl", "eval_after.jsonl"):
        shutil.copy(run / name, torn / name)
    metrics = (run / "metrics.jsonl").read_text()
    (torn / "metrics.jsonl").write_text(metrics + '{"step": 33, "rew')
    result = analyze(torn)
    assert result.returncode == 0 and "ignoring a half-written last line" in result.stderr, result.stderr
    assert "gained 20, lost 7, sign test p = 0.0192" in result.stdout
    (torn / "eval_after.jsonl").write_text("")
    result = analyze(torn)
    assert result.returncode == 2 and "a pair of evaluations is empty or holds other problems" in result.stderr
    (torn / "eval_after.jsonl").unlink()
    still = [{**json.loads(line), "policy_kl": 0.0} for line in metrics.splitlines()]
    (torn / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in still))
    result = analyze(torn, tmp_path / "curves.png")
    assert result.returncode == 0 and "warning" not in result.stderr.lower(), result.stderr
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_the_model_build_script_reads_its_arguments_before_it_downloads_anything(tmp_path):
    """tests/build_qwen_coder.py once took `--help` for its destination and built a 2.4 GB model in a folder named
    --help. Help, a size it has no release of, and a folder that holds something but no model end before pip runs
    (the working folder stays empty); a folder with a model is left as it is."""
    build = lambda *args, cwd=tmp_path: subprocess.run(
        [sys.executable, str(ROOT / "tests" / "build_qwen_coder.py"), *args], capture_output=True, text=True,
        timeout=60, cwd=cwd)
    work = tmp_path / "work"
    work.mkdir()
    result = build("--help", cwd=work)
    assert result.returncode == 0 and "usage:" in result.stdout and "--size" in result.stdout
    assert list(work.iterdir()) == []
    result = build("model", "--size", "3b")
    assert result.returncode == 2 and "invalid choice: '3b'" in result.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    result = build(str(tmp_path / "full"))
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'full'} exists and holds no model: name a new or empty folder"]
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["notes.txt"]
    (tmp_path / "built").mkdir()
    (tmp_path / "built" / "config.json").write_text("{}")
    result = build(str(tmp_path / "built"), "--size", "1.5b")
    assert result.returncode == 0 and "already holds a model" in result.stdout and "pip" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built", "full", "work"]


# ----- round 6 (#89): what users do to a run -----

def test_a_model_folder_without_its_tokenizer_json_is_refused_not_scored_as_empty(model_dir, gsm8k_dir, tmp_path,
                                                                                   capsys):
    """tokenizer_config.json alone loads as a tokenizer of 3 special tokens: --eval-only scored every completion
    empty (Accuracy 0.00%, exit 0) and training failed on the first token id it could not hold."""
    bare = shutil.copytree(model_dir, tmp_path / "no-tokenizer-json")
    (bare / "tokenizer.json").unlink()
    assert (bare / "tokenizer_config.json").exists()
    for extra in (["--eval-only"], []):
        out = tmp_path / f"run{len(extra)}"
        code, err = main_err([bare, "--dataset", gsm8k_dir, "--output-dir", out, "--device", "cpu", *extra], capsys)
        assert code == 2 and "its tokenizer has" in err and "tokenizer.json missing" in err, err
        assert not out.exists()


KILL_AFTER_CHECKPOINT = """
import os, sys
sys.path.insert(0, {root!r})
import grpo_homework as gh
real = gh.save_checkpoint
def save_then_die(run_dir, model, tokenizer, optimizer, scheduler, record, *rest):
    path = real(run_dir, model, tokenizer, optimizer, scheduler, record, *rest)
    if record["step"] == 2:
        os._exit(9)          # SIGKILL's effect: nothing after the checkpoint runs
    return path
gh.save_checkpoint = save_then_die
sys.exit(gh.main(sys.argv[1:]))
"""


def test_a_kill_just_after_a_checkpoint_loses_no_metrics_row(model_dir, gsm8k_dir, tmp_path):
    out = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_CHECKPOINT.format(root=str(ROOT)),
                             *map(str, tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "3", "--save-every", "2"))],
                            capture_output=True, text=True, env=cli_env(), timeout=300)
    assert killed.returncode == 9 and (out / "checkpoints" / "step-2").is_dir(), killed.stderr[-2000:]
    code = gh.main(["--resume", str(out)])
    assert code == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_a_finished_run_trained_further_moves_its_earlier_end_aside(run_copy, capsys, monkeypatch):
    """A finished 2-step run continued to 4 and stopped mid-training shows no final/, no evaluation after and no
    comparison of the end it went past; they are kept in earlier-ends/step-2/, and the summary says so."""
    earlier = (run_copy / "eval_after.jsonl").read_text()
    real = gh.generate_completions      # the evaluation before is kept: the first call samples step 3
    monkeypatch.setattr(gh, "generate_completions", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    code, err = main_err(["--resume", run_copy, "--max-steps", "4"], capsys)
    assert code == 2 and "failed (boom) during training" in err, err
    assert not any((run_copy / name).exists() for name in ("final", "eval_after.jsonl", "report_draft.md"))
    kept = run_copy / "earlier-ends" / "step-2"
    assert (kept / "final" / "model.safetensors").exists() and (kept / "eval_after.jsonl").read_text() == earlier
    assert json.loads((kept / "summary.json").read_text())["finished"] is True
    summary = json.loads((run_copy / "summary.json").read_text())
    assert summary["finished"] is False and "accuracy_after" not in summary and "gained" not in summary
    assert summary["earlier_ends"] == ["earlier-ends/step-2"] and "accuracy_before" in summary
    assert gh.main(["--report", str(run_copy)]) == 0 and "| - | - | - |" in (run_copy / "report_draft.md").read_text()
    monkeypatch.setattr(gh, "generate_completions", real)
    assert gh.main(["--resume", str(run_copy)]) == 0
    summary = json.loads((run_copy / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 4 and summary["earlier_ends"] == ["earlier-ends/step-2"]
    assert (run_copy / "final").is_dir() and (kept / "final").is_dir()


def test_a_run_folder_inside_its_plain_file_data_folder_still_resumes(model_dir, tmp_path):
    """--dataset . with train.jsonl / test.jsonl and the run in ./runs/grpo: datasets read the run's
    eval_before.jsonl as a test file ('eval'), and every later run on that data failed (CastError)."""
    data = tmp_path / "data"
    data.mkdir()
    for split, rows in (("train", PROBLEMS), ("test", PROBLEMS[:4])):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = data / "runs" / "grpo"
    assert gh.main(tiny_args(model_dir, data, out, "--max-steps", "1", "--save-every", "1")) == 0
    assert gh.main(["--resume", str(out), "--max-steps", "2"]) == 0
    assert gh.main(tiny_args(model_dir, data, data / "runs" / "second", "--max-steps", "1")) == 0
    assert len((data / "runs" / "second" / "eval_before.jsonl").read_text().splitlines()) == 4


def test_resume_refuses_num_epochs_at_or_below_the_epoch_reached(model_dir, gsm8k_dir, tmp_path, capsys):
    """4 batches an epoch: step 5 is in epoch 2. A stop during the final evaluation leaves it unfinished there."""
    out = tmp_path / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--num-epochs", "2", "--max-steps", "5", "--save-every",
                             "5")) == 0
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**summary, "finished": False}))
    config = (out / "config.json").read_text()
    code, err = main_err(["--resume", out, "--num-epochs", "1"], capsys)
    assert code == 2 and "--num-epochs 1" in err and "in epoch 2 already" in err, err
    assert (out / "config.json").read_text() == config


@pytest.mark.parametrize("flags, why", [
    (["--clip-eps", "0.3"], "with one PPO epoch"),
    (["--advantage", "drgrpo", "--advantage-eps", "1e-3"], "with --advantage drgrpo"),
    (["--min-signal-groups", "0", "--max-draws", "2"], "with --min-signal-groups 0"),
])
def test_clip_eps_advantage_eps_and_max_draws_where_they_do_nothing_are_refused(model_dir, gsm8k_dir, tmp_path, capsys,
                                                                               flags, why):
    out = tmp_path / "run"
    code, err = main_err([model_dir, "--dataset", gsm8k_dir, "--output-dir", out, *flags], capsys)
    assert code == 2 and "would do nothing" in err and why in err and not out.exists(), err
    flag = flags[-2]         # where the setting is read, the flag is taken
    enabling = {"--clip-eps": ["--ppo-epochs", "2"], "--advantage-eps": [],
                "--max-draws": ["--min-signal-groups", "2"]}[flag]
    cfg, _ = gh.parse_config([str(model_dir), *enabling, flag, flags[-1]])
    assert getattr(cfg, flag[2:].replace("-", "_")) == float(flags[-1])


def test_resume_of_an_interrupted_eval_only_run_takes_no_training_flags(model_dir, gsm8k_dir, tmp_path, capsys):
    out = tmp_path / "scores"
    assert gh.main([str(model_dir), "--dataset", str(gsm8k_dir), "--output-dir", str(out), "--device", "cpu",
                    "--eval-only", "--eval-size", "2", "--max-new-tokens", "4"]) == 0
    for name in ("summary.json", "eval.jsonl"):         # as a stop during the scoring leaves it
        (out / name).unlink()
    capsys.readouterr()
    config = (out / "config.json").read_text()
    for flags in (["--max-steps", "3"], ["--micro-batch-size", "2"], ["--save-every", "1"]):
        code, err = main_err(["--resume", out, *flags], capsys)
        assert code == 2 and "would do nothing" in err and "--eval-only run" in err, err
    assert (out / "config.json").read_text() == config
    assert gh.main(["--resume", str(out), "--eval-batch-size", "1"]) == 0
    captured = capsys.readouterr()
    assert "scoring" in captured.out and "training starts" not in captured.err
    assert json.loads((out / "summary.json").read_text())["scored"]["problems"] == "test 0-1"


def test_eval_only_names_the_problems_it_scored_when_long_prompts_are_dropped(model_dir, tmp_path, capsys):
    rows = [{"question": f"Q{i}: " + ("a long long question " * 20 if i % 3 == 1 else "short?"),
             "answer": f"#### {i}"} for i in range(10)]
    data = gh.write_hub_dataset(tmp_path / "data", {"train": rows, "test": rows})
    out = tmp_path / "scores"
    assert gh.main([str(model_dir), "--dataset", str(data), "--output-dir", str(out), "--device", "cpu",
                    "--eval-only", "--max-new-tokens", "2", "--max-prompt-length", "100", "--eval-start", "1",
                    "--prompt-style", "plain"]) == 0
    scored = json.loads((out / "summary.json").read_text())["scored"]["problems"]
    assert scored == "test 2-3, 5-6, 8-9"      # 1, 4 and 7 are long
    assert gh.number_ranges([7, 0, 1, 2, 5]) == "0-2, 5, 7" and gh.number_ranges([]) == ""


def test_a_diverged_run_names_the_learning_rate_not_a_resume(warm_model_dir, addition_dir, tmp_path):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, SCRIPT, *tiny_args(warm_model_dir, addition_dir, out, "--prompt-style",
                                                                "plain", "--batch-size", "4", "--train-size", "0",
                                                                "--learning-rate", "1e30", "--max-steps", "6")],
                            capture_output=True, text=True, env=cli_env(), timeout=300)
    err = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "diverged" in err and "--learning-rate (now 1e+30)" in err, result.stderr[-2000:]
    assert "--resume" not in err and "Traceback" not in result.stderr


def test_resume_names_model_path_as_the_positional_argument_it_is(run_copy, capsys):
    code, err = main_err(["--resume", run_copy, "/some/other/model", "--max-steps", "3"], capsys)
    assert code == 2 and "--resume cannot change MODEL_PATH" in err and "--model-path" not in err, err


def test_a_readme_less_data_folder_with_stray_files_still_loads(tmp_path):
    """datasets keeps only data files of the split names; the run-folder filter (#89) must not hand it train.log or
    test_notes.md as data (it did: FileNotFoundError, ArrowInvalid)."""
    from datasets import Dataset
    for split, rows in (("train", PROBLEMS), ("test", PROBLEMS[:4])):
        Dataset.from_list(rows).to_parquet(str(tmp_path / f"{split}.parquet"))
    (tmp_path / "train.log").write_text("a log\n")
    (tmp_path / "test_notes.md").write_text("# notes\n")
    assert len(gh.load_split(str(tmp_path), "train")) == 8 and len(gh.load_split(str(tmp_path), "test")) == 4


# ----- round 7 (#94): what users do to a run -----

@pytest.mark.parametrize("lost", ["summary.json", "eval_before.jsonl"])
def test_a_resume_that_lost_the_starting_models_scores_never_scores_a_checkpoint_in_their_place(run_copy, capsys,
                                                                                                lost):
    """It printed 'Evaluating the starting model' and overwrote eval_before.jsonl with the trained checkpoint's
    answers (and a finished run's final/ in place)."""
    before = (run_copy / "eval_before.jsonl").read_text() if lost != "eval_before.jsonl" else None
    weights = (run_copy / "final" / "model.safetensors").read_bytes()
    (run_copy / lost).unlink()
    code, err = main_err(["--resume", run_copy, "--max-steps", "4"], capsys)
    assert code == 2 and f"its {lost} is missing" in err and "starting model's scores are lost" in err, err
    assert before is None or (run_copy / "eval_before.jsonl").read_text() == before
    assert (run_copy / "final" / "model.safetensors").read_bytes() == weights
    assert not (run_copy / "earlier-ends").exists()


def test_a_demo_whose_model_cannot_be_written_says_so_in_one_line_and_keeps_nothing(tmp_path):
    """ulimit -f: the model's safetensors write fails (a traceback, exit 1); the warm-up is skipped to be quick."""
    out = tmp_path / "demo"
    code = ("import resource, sys; sys.path.insert(0, sys.argv[2]); import grpo_homework as gh; "
            "gh.supervised_warmup = lambda *a, **k: 0; "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (300 * 1024, 300 * 1024)); "
            "sys.exit(gh.main(['--demo', '--output-dir', sys.argv[1]]))")
    result = subprocess.run([sys.executable, "-c", code, str(out), str(ROOT)], capture_output=True, text=True,
                            env=cli_env(), timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[-1].startswith("error: failed while building the demo (") and "nothing was kept" in lines[-1]
    assert not out.exists() or files_under(out) == [], files_under(out)


@pytest.mark.parametrize("flags", [["--task", "arithmetic"], ["--dataset", "/some/data"]])
def test_the_demo_refuses_a_task_or_dataset_it_would_ignore(tmp_path, capsys, flags):
    code, err = main_err(["--demo", "--output-dir", tmp_path / "demo", *flags], capsys)
    assert code == 2 and "on addition problems it generates: leave out" in err and flags[0] in err, err
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("flags", [["--show-examples", "3"], ["--seed", "1"], ["--val-size", "4"]])
def test_eval_only_refuses_flags_that_do_nothing_there(model_dir, gsm8k_dir, tmp_path, capsys, flags):
    code, err = main_err([model_dir, "--dataset", gsm8k_dir, "--output-dir", tmp_path / "s", "--eval-only", *flags],
                         capsys)
    assert code == 2 and flags[0] in err and "would do nothing" in err and not (tmp_path / "s").exists(), err
    cfg, _ = gh.parse_config([str(model_dir), "--eval-only", "--val-size", "4", "--eval-split", "validation"])
    assert cfg.val_size == 4          # where it acts, it is taken


@pytest.mark.parametrize("completion, gold, right", [
    ("\\boxed{1000000001}", 1_000_000_000, False), ("#### 12345678900", 12_345_678_901, False),
    ("#### 12,345,678,901", 12_345_678_901, True), ("\\boxed{0.3}", 0.1 + 0.2, True), ("#### 2.50", 2.5, True),
    ("#### 5.0000001", 5, False)])
def test_answers_are_graded_exactly_and_integers_get_no_tolerance(completion, gold, right):
    assert gh.compute_reward([completion], [gold]).tolist() == [float(right)]
    assert (gh.compute_reward([completion], [gold]).item() == 1.0) is right


def test_strict_answers_read_the_number_of_the_well_formed_final_line():
    completions = ["\\boxed{7} so the answer is 5", "\\boxed{7} so the answer is 5", "The answer is 5.\n#### 7"]
    assert (gh.final_line_answer(completions[0]) is not None)
    assert gh.compute_reward(completions, [5, 7, 7], strict_answer=True).tolist() == [0.0, 1.0, 1.0]
    assert gh.compute_reward(completions, [5, 7, 7]).tolist() == [1.0, 0.0, 1.0]     # lenient: the last marker


def test_the_templates_loading_drops_a_row_without_a_gold_and_names_it(tmp_path, capsys):
    rows = [*PROBLEMS[:3], {"question": "No gold here?", "answer": "it is 72"}, PROBLEMS[3]]
    data = gh.write_hub_dataset(tmp_path / "data", {"train": rows, "test": rows})
    dataset = gh.GSM8KDataset("train", None, dataset_path=str(data))
    assert len(dataset) == 4 and None not in dataset.answers and "No gold here?" not in dataset.questions
    assert "dropped row(s) [3]" in capsys.readouterr().err


def test_a_kl_penalty_without_its_reference_is_refused_not_dropped():
    """The plain loop has no KL penalty to drop: its Config refuses the setting. The run's update hooks, which add
    the penalty, refuse a coefficient without the reference model it is measured against."""
    with pytest.raises(TypeError, match="kl_coef"):
        gh.Config(kl_coef=10.0)
    with pytest.raises(ValueError, match="kl_coef > 0 needs the reference model"):
        gh.UpdateHooks(gh.RunConfig(kl_coef=10.0), None)
    assert gh.UpdateHooks(gh.RunConfig(kl_coef=10.0), None, ref_model=torch.nn.Linear(1, 1)).ref_model is not None


def test_no_optimizer_step_is_taken_on_a_zero_gradient(model_and_tokenizer):
    """kl_coef > 0 keeps rows with zero advantage; with the policy at its reference every gradient is exactly 0,
    and AdamW's step would still create state (and later replay momentum)."""
    from conftest import update_once
    from test_grpo import _rollout
    model, tok = model_and_tokenizer
    cfg = gh.RunConfig(group_size=4, max_new_tokens=6, micro_batch_size=5, kl_coef=0.5)
    rollout = _rollout(model, tok, cfg)
    rollout.advantages.zero_()
    optimizer = gh.build_optimizer(model.parameters(), lr=1e-2)
    weights = [p.detach().clone() for p in model.parameters()]
    stats = update_once(model, optimizer, rollout, cfg, ref_model=copy.deepcopy(model))
    assert stats["grad_norm"] == 0 and stats["skipped"] == 1 and not optimizer.state
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))


def test_a_model_folder_holding_adapter_files_says_why_nothing_would_train(model_dir, gsm8k_dir, tmp_path, capsys):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    folder = shutil.copytree(model_dir, tmp_path / "model")
    model = gh.load_model_and_tokenizer(str(model_dir), torch.device("cpu"), "float32")[0]
    with warnings.catch_warnings():       # peft reads transformers' deprecated is_gradient_checkpointing: not ours
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(tmp_path / "adapter")
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**adapter, "base_model_name_or_path": str(model_dir)}))
    shutil.copy(tmp_path / "adapter" / "adapter_model.safetensors", folder)
    with warnings.catch_warnings():       # loading the folder (transformers through peft) warns of nothing either
        warnings.simplefilter("error", FutureWarning)
        code, err = main_err(tiny_args(folder, gsm8k_dir, tmp_path / "run", "--max-steps", "1"), capsys)
    assert code == 2 and "no weight of the model would train" in err and "adapter_config.json" in err, err


def test_committed_scorings_are_labelled_as_scorings_not_as_a_before():
    """An --eval-only summary says what it scored: no accuracy_before / accuracy_after that could be read as a
    training's starting point or end (plots/qwen-gsm8k-b256/summary_after_untouched_256.json was one)."""
    scorings = []
    for path in sorted((ROOT / "plots").rglob("*summary*.json")):
        summary = json.loads(path.read_text())
        config = path.with_name(path.name.replace("summary", "config"))
        eval_only = summary.get("eval_only") or (config.exists() and
                                                 json.loads(config.read_text())["config"].get("eval_only"))
        untrained = summary.get("steps") == 0 and summary.get("finished") and "accuracy_after" not in summary
        if eval_only or untrained:
            scorings.append(path)
            assert "accuracy_before" not in summary and "accuracy_after" not in summary, path
            assert summary["eval_only"] and set(summary["scored"]) >= {"model", "max_new_tokens", "problems"}, path
    assert len(scorings) >= 25


# ----- round 8 (#99): what users do to a run -----

@pytest.mark.parametrize("before", [None, {}, "31%", {"format_rate": 0.5}])
def test_a_resume_whose_scores_before_are_damaged_is_refused_like_lost_ones(run_copy, capsys, before):
    """`null` re-scored checkpoint 3 as the starting model and overwrote eval_before.jsonl; {} and "31%" failed
    with advice (resume) that failed the same way."""
    summary = json.loads((run_copy / "summary.json").read_text())
    (run_copy / "summary.json").write_text(json.dumps({**summary, "before": before}))
    scores_before = (run_copy / "eval_before.jsonl").read_text()
    code, err = main_err(["--resume", run_copy, "--max-steps", "4"], capsys)
    assert code == 2 and "its summary.json's scores before is missing" in err, err
    assert (run_copy / "eval_before.jsonl").read_text() == scores_before and not (run_copy / "earlier-ends").exists()


def test_the_records_say_which_device_dtype_and_generation_ran(model_dir, gsm8k_dir, tmp_path):
    """config.json said "device": "auto" (--eval-only too) and nothing of the generation path."""
    out = tmp_path / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1")) == 0
    ran = json.loads((out / "config.json").read_text())["ran"]
    assert ran == {"device": "cpu", "dtype": "float32", "generation": "dynamic cache"}, ran
    scored = tmp_path / "scored"
    assert gh.main([str(model_dir), "--dataset", str(gsm8k_dir), "--eval-only", "--output-dir", str(scored),
                    "--eval-size", "2", "--max-new-tokens", "4", "--compile-generation", "off"]) == 0
    assert json.loads((scored / "config.json").read_text())["ran"]["device"] == "cpu"


def test_a_compiled_generation_that_fell_back_is_recorded_with_where(model_dir, gsm8k_dir, tmp_path, monkeypatch):
    """A run whose compile failed said "compile_generation": "on" and nothing else."""
    import transformers
    from transformers import CompileConfig

    def broken(graph, example_inputs):
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(transformers, "CompileConfig", lambda: CompileConfig(backend=broken, mode=None))
    out = tmp_path / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1", "--compile-generation", "on")) == 0
    assert json.loads((out / "config.json").read_text())["ran"]["generation"] == "compiled static cache"
    fallback = json.loads((out / "summary.json").read_text())["generation_fallback"]
    assert fallback["at"] == "the evaluation before training" and "broken" in fallback["error"], fallback


def test_a_second_ctrl_c_a_second_after_the_first_aborts(monkeypatch):
    """A 2 s debounce swallowed it, and the step ran on (44 s in one case)."""
    clock = [100.0]
    monkeypatch.setattr(gh.time, "monotonic", lambda: clock[0])
    monkeypatch.setitem(gh._ctrl_c, "training", True)
    monkeypatch.setitem(gh._ctrl_c, "asked", 0.0)
    gh.on_ctrl_c(signal.SIGINT, None)                  # the first: stop after this step
    clock[0] += 0.05
    gh.on_ctrl_c(signal.SIGINT, None)                  # the same press, forwarded twice by a launcher
    clock[0] += 1.0
    with pytest.raises(KeyboardInterrupt):
        gh.on_ctrl_c(signal.SIGINT, None)
    monkeypatch.setitem(gh._ctrl_c, "pressed", False)


def test_a_starting_model_with_nan_is_named_before_any_scoring_or_step(model_dir, gsm8k_dir, tmp_path, capsys):
    """It recorded 0.00% as the model's score, then blamed the learning rate at step 0."""
    from transformers import AutoModelForCausalLM
    broken = tmp_path / "nan-model"
    shutil.copytree(model_dir, broken)
    model = AutoModelForCausalLM.from_pretrained(broken)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = math.nan
    model.save_pretrained(broken)
    out = tmp_path / "run"
    code, err = main_err(tiny_args(broken, gsm8k_dir, out, "--max-steps", "1"), capsys)
    assert code == 2 and "NaN or inf" in err and "before any training" in err and "learning-rate" not in err, err
    assert not (out / "eval_before.jsonl").exists()


def test_a_sampling_error_under_compiled_generation_is_not_called_a_compile_failure(model_and_tokenizer):
    model, tok = model_and_tokenizer
    generation = gh.CompiledGeneration(model, lambda: (4,))

    def nan_sampling(**kwargs):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    generation.plain = nan_sampling
    with pytest.raises(RuntimeError, match="probability tensor"):
        generation(input_ids=torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3, dtype=torch.long),
                   generation_config=model.generation_config)
    assert not generation.failed


@pytest.mark.parametrize("rows, runs_as", [(16, 16), (2, 2), (24, 32), (40, 48), (60, 64)])
def test_compiled_generation_pads_rows_to_a_power_of_two_or_a_batch_size(model_and_tokenizer, rows, runs_as):
    """Every call ran at a full batch size: 16 training rows as 64, 2 as 64 (3.77 s against 0.41 s)."""
    model, _ = model_and_tokenizer
    generation, shapes = gh.CompiledGeneration(model, lambda: (64, 48)), []
    generation.plain = lambda input_ids, attention_mask, generation_config: shapes.append(input_ids.shape) or \
        torch.cat([input_ids, input_ids[:, :1]], 1)
    out = generation(input_ids=torch.ones(rows, 5, dtype=torch.long), attention_mask=torch.ones(rows, 5,
                     dtype=torch.long), generation_config=model.generation_config)
    assert shapes == [(runs_as, 128)] and out.shape == (rows, 6)


def test_the_cpu_memory_check_budgets_the_padded_shape_compiled_generation_runs(model_and_tokenizer, monkeypatch):
    """It budgeted the rows and prompt width asked for, not the padded ones that run."""
    model, _ = model_and_tokenizer
    cfg = gh.RunConfig(eval_only=True, eval_batch_size=24, max_prompt_length=100, max_new_tokens=28)
    c = model.config
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    kib = -(-24 * 128 * per_token // 1024)         # the 24 x 128 tokens asked for fit; 24 x 156 run, and do not
    monkeypatch.setattr(gh, "Path", lambda p: type("Meminfo", (), {"read_text": lambda self: f"MemAvailable: "
                                                                   f"{kib} kB\n"})())
    model.generate = gh.CompiledGeneration(model, lambda: (64, cfg.eval_batch_size))
    try:
        gh.check_kv_cache_fits(dataclasses.replace(cfg, eval_batch_size=16, max_prompt_length=100), model,
                               torch.device("cpu"))                 # 16 x 256 fits
        cfg.eval_batch_size = 24
        with pytest.raises(gh.UserError, match=r"--eval-batch-size 24 x 156 tokens"):
            gh.check_kv_cache_fits(cfg, model, torch.device("cpu"))
    finally:
        del model.generate


@pytest.mark.parametrize("text, gold, reward", [("#### 9007199254740993", 9007199254740992.0, 0.0),
                                                ("#### 9007199254740992", 9007199254740992.0, 1.0),
                                                ("#### 100000000000000000000", 1e20, 1.0)])
def test_integers_are_compared_as_written_even_beyond_2_to_the_53(text, gold, reward):
    """9007199254740993 was rewarded against 9007199254740992 (both one float)."""
    assert gh.compute_reward([text], [gold]).tolist() == [reward]


def test_a_gold_a_float_cannot_hold_is_dropped_with_a_warning_not_rounded(tmp_path, capsys):
    """Gold 12345678901234567890 was shown (and compared) as 12345678901234567168."""
    assert gh.GSM8KDataset.extract_answer("so #### 12345678901234567890") is None
    assert gh.GSM8KDataset.extract_answer(12345678901234567890) is None
    rows = PROBLEMS[:2] + [{"question": "How many grains?", "answer": "many\n#### 12345678901234567890"}]
    folder = gh.write_hub_dataset(tmp_path / "d", {"train": rows, "test": rows})
    data = gh.GSM8KDataset("test", gh.build_byte_tokenizer(), dataset_path=str(folder))
    assert data.answers == [7.0, 60.0] and "dropped row(s) [2]" in capsys.readouterr().err


def test_ctrl_c_during_report_replaces_nothing_drawn_so_far(run_copy, capsys, monkeypatch):
    """It said "nothing was written" after two plots had been rewritten."""
    plots = sorted((run_copy / "plots").iterdir())
    inodes = {p.name: p.stat().st_ino for p in plots}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(gh, "write_report_draft", interrupted)
    code, err = main_err(["--report", run_copy], capsys)
    assert code == 2 and "interrupted; nothing was changed" in err, err
    assert {p.name: p.stat().st_ino for p in sorted((run_copy / "plots").iterdir())} == inodes
    assert not [p for p in run_copy.iterdir() if p.name.startswith(".report-")]
    monkeypatch.undo()
    assert gh.main(["--report", str(run_copy)]) == 0
    assert {p.name: p.stat().st_ino for p in sorted((run_copy / "plots").iterdir())} != inodes
