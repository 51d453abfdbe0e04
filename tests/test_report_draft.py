"""report_draft.md: every figure a run's draft shows, rebuilt here from its records by other routes (loops, the
binomial sum written out, the paired differences' variance), on a tiny run and on the project's real runs."""
import json
import math
import statistics
import time
from pathlib import Path

import pytest

import grpo_homework as gh
from conftest import ROOT
from test_cli import tiny_args

REAL_RUNS = {"0.5B": ROOT / "plots" / "qwen-gsm8k-b256" / "rerun", "1.5B": ROOT / "plots" / "qwen-1.5b-run" / "run"}
RESULT_COLUMNS = ("| problems | max new tokens | accuracy before | after | difference, points (95% CI) "
                  "| newly right / newly wrong | p |")


def rows(text: str, header: str) -> list[list[str]]:
    """The cells of the markdown table under `header` (its first line), header and rule left out."""
    lines = text.splitlines()
    start = lines.index(header) + 2
    table = []
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        table.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return table


def records(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines() if line.strip()]


def sign_test(gained: int, lost: int) -> float:
    """Two-sided exact sign test, the binomial tail summed term by term."""
    n, k = gained + lost, min(gained, lost)
    tail = sum(math.factorial(n) // (math.factorial(i) * math.factorial(n - i)) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail) if n else 1.0


def check_against_records(run_dir: Path, text: str) -> None:
    """Results, hyperparameters, the step table and the answers' sections of `text`, rebuilt from run_dir's records."""
    config = json.loads((run_dir / "config.json").read_text())["config"]
    before, after = records(run_dir, "eval_before.jsonl"), records(run_dir, "eval_after.jsonl")
    n = len(before)
    diffs = [int(a["correct"]) - int(b["correct"]) for b, a in zip(before, after)]
    gained, lost = diffs.count(1), diffs.count(-1)
    d, half = statistics.fmean(diffs), 1.96 * math.sqrt(statistics.pvariance(diffs) / n)
    [result] = rows(text, RESULT_COLUMNS)
    assert result == [f"{n} {config['eval_split']}", str(config["max_new_tokens"]),
                      f"{sum(r['correct'] for r in before) / n:.1%}", f"{sum(r['correct'] for r in after) / n:.1%}",
                      f"{100 * d:+.1f} ({100 * (d - half):+.1f} to {100 * (d + half):+.1f})", f"{gained} / {lost}",
                      f"{sign_test(gained, lost):.3g}"]

    settings = dict(rows(text, "| setting | value |"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert settings["model"] == Path(config["model_path"]).name and settings["dtype"] == config["dtype"]
    drawn = (1 + config["max_draws"]) * config["batch_size"]       # the step pools batches for groups with signal
    assert settings["questions x answers per update"] == f"{config['batch_size']} x {config['group_size']}" + (
        f", from up to {drawn} questions drawn" if config["min_signal_groups"] else "")
    assert max(m["prompts_drawn"] for m in records(run_dir, "metrics.jsonl")) <= drawn
    assert settings["optimizer"] == f"AdamW, weight decay {config['weight_decay']:g}" + (
        "; bf16 weights rounded stochastically" if config["dtype"] == "bfloat16" else "")
    assert settings["max new tokens"] == str(config["max_new_tokens"])
    assert float(settings["temperature"]) == config["temperature"]
    assert float(settings["learning rate; schedule"].split(";")[0]) == config["learning_rate"]
    assert settings["clip range"] == f"{1 - config['clip_eps']:g} to {1 + config['clip_eps']:g}"
    assert float(settings["KL penalty"]) == config["kl_coef"] and settings["seed"] == str(config["seed"])
    assert settings["loss reduction"] == {"drgrpo": f"sum / (answers x {config['max_new_tokens']})",
                                          "seq-mean": "mean per answer, then over answers"}[config["loss_agg"]]
    assert settings["advantage"] == {"grpo": f"(r - group mean) / (group std + {config['advantage_eps']:g})",
                                     "drgrpo": "r - group mean"}[config["advantage"]]
    assert settings["steps run"] == f"{summary['steps']} of {config['max_steps']} at most"
    targets = config.get("lora_targets")
    targets = "every linear layer but the output layer" if targets == "all-linear" else targets
    assert settings["weights trained"] == (f"LoRA rank {config['lora_rank']}, alpha {config['lora_alpha']}, in "
                                           f"{targets}" if config.get("lora_rank") else "all")

    metrics = records(run_dir, "metrics.jsonl")
    shown = rows(text, gh.STEP_COLUMNS)
    every = max(1, len(metrics) // 4)
    assert [int(r[0]) for r in shown] == sorted({1, len(metrics), *range(every, len(metrics) + 1, every)})
    for row in shown:
        m = metrics[int(row[0]) - 1]
        for cell, key, digits in zip(row[1:], ("reward_mean", "loss", "grad_norm", "policy_kl", "entropy",
                                               "completion_len_mean", "truncated_frac"), (3, 4, 3, 5, 3, 0, 2)):
            half_unit = 0.5 * 10 ** -digits + 1e-12          # the shown value rounds the record's
            assert cell == "-" if m[key] is None else abs(float(cell) - m[key]) <= half_unit, (key, cell)

    [cut_off, mean_tokens, right_of_ended] = rows(text, "| answers | before | after |")
    for column, evaluation in enumerate((before, after), 1):
        ended = [r for r in evaluation if not r["truncated"]]
        assert int(cut_off[column]) == n - len(ended)
        assert abs(float(mean_tokens[column]) - statistics.fmean(r["tokens"] for r in evaluation)) <= 0.5
        assert right_of_ended[column] == f"{sum(1 for r in ended if r['correct'])} of {len(ended)}"
    for title, count in (("Wrong before, right after", gained), ("Right before, wrong after", lost)):
        heading = next(line for line in text.splitlines() if line.startswith(f"### {title}: "))
        assert heading == f"### {title}: {count}" + (", the first 3 in problem order" if count > 3 else "")
    flipped = [i for i, (b, a) in enumerate(zip(before, after), 1) if b["correct"] != a["correct"]]
    first = [i for i in flipped if after[i - 1]["correct"]][:3] + [i for i in flipped if before[i - 1]["correct"]][:3]
    assert [int(line.split()[2]) for line in text.splitlines() if line.startswith("#### Line ")] == first
    for i in first:        # each answer whole, as it was written, on lines of its own
        assert f"\n{before[i - 1]['completion']}\n```" in text and f"\n{after[i - 1]['completion']}\n```" in text


@pytest.fixture(scope="module")
def tiny_run(model_dir, gsm8k_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft") / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "4", "--kl-coef", "0.05",
                             "--loss-agg", "drgrpo", "--plot-every", "0")) == 0
    return out


def test_a_finished_runs_draft_is_its_records_and_report_draws_it_again_the_same(tiny_run, tmp_path):
    text = (tiny_run / "report_draft.md").read_text()
    check_against_records(tiny_run, text)
    assert "plus 0.05 x the k3 KL divergence to the starting model" in text and "(Dr. GRPO)" in text
    assert [line for line in text.splitlines() if line.startswith("![")] == [
        f"![{name}](plots/{name})" for name in ("reward.png", "length.png", "clip_kl.png", "entropy.png")]
    assert all((tiny_run / "plots" / name).is_file() for name in ("reward.png", "entropy.png"))
    assert gh.write_report_draft(tiny_run, into=tmp_path).read_text() == text


def test_the_drafts_of_the_projects_runs_hold_its_reported_figures(tmp_path):
    """Hand-checked: the 0.5B's own evaluation (test 0-199 at 256 tokens) and the 1.5B's (validation 0-49)."""
    drafts = {}
    for name, run_dir in REAL_RUNS.items():
        (tmp_path / name).mkdir()
        drafts[name] = gh.write_report_draft(run_dir, into=tmp_path / name).read_text()
        check_against_records(run_dir, drafts[name])
        # report.md cites the committed draft: it must be the one this code writes from the records
        assert (run_dir / "report_draft.md").read_text() == drafts[name], f"redraw {run_dir / 'report_draft.md'}"
    assert "| 200 test | 256 | 19.0% | 25.0% | +6.0 (+0.3 to +11.7) | 23 / 11 | 0.0576 |" in drafts["0.5B"]
    assert "| 50 validation | 384 | 54.0% | 72.0% | +18.0 (+7.4 to +28.6) | 9 / 0 | 0.00391 |" in drafts["1.5B"]


def test_report_md_shows_the_drafts_tables_so_the_two_cannot_disagree(tmp_path):
    """report.md's hyperparameter table is the two drafts' side by side; its step tables are theirs, row for row."""
    report = (ROOT / "report.md").read_text()
    drafts = {}
    for name, run_dir in REAL_RUNS.items():
        (tmp_path / name).mkdir()
        drafts[name] = gh.write_report_draft(run_dir, into=tmp_path / name).read_text()
        steps = [line for line in drafts[name].splitlines() if line.startswith("| ") and line[2].isdigit()][1:]
        assert steps and all(line in report for line in steps), name
    small, large = (dict(rows(drafts[name], "| setting | value |")) for name in REAL_RUNS)
    assert small.keys() == large.keys()
    for setting in small:
        assert f"| {setting} | {small[setting]} | {large[setting]} |" in report, setting
    # the last column: what `python grpo_homework.py MODEL_PATH` runs, as a draft of it would say (on a bf16 GPU)
    c = {**gh.dataclasses.asdict(gh.RunConfig()), "model_path": "Qwen2.5-1.5B-Instruct", "dtype": "bfloat16"}
    defaults = dict(rows("\n".join(gh.draft_sections(c, {"steps": 0}, [], [], [])), "| setting | value |"))
    shown = {row[0]: row[3] for row in rows(report, "| setting | Coder-0.5B | Coder-1.5B | the file's defaults |")}
    assert shown.keys() == defaults.keys() and shown.pop("steps run") == "200 at most; none run"
    assert all(shown[setting].startswith(defaults[setting]) for setting in shown), (shown, defaults)


def test_a_stopped_run_writes_what_it_has_and_says_what_is_missing(model_dir, gsm8k_dir, tmp_path, monkeypatch,
                                                                   capsys):
    """Ctrl-C in step 1 stops after it: the draft has the evaluation before, step 1, and names what is missing."""
    out = tmp_path / "run"
    real = gh.compute_reward

    def pressed_once(*args, **kwargs):
        gh._ctrl_c["asked"] = gh._ctrl_c["asked"] or time.monotonic()
        return real(*args, **kwargs)
    monkeypatch.setattr(gh, "compute_reward", pressed_once)
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "3")) == 2
    assert f"--resume {out}" in capsys.readouterr().err
    text = (out / "report_draft.md").read_text()
    assert f"Missing: the evaluation after training (eval_after.jsonl); the run is at step 1: " \
           f"`python grpo_homework.py --resume {out}` finishes it." in text
    assert [r[0] for r in rows(text, gh.STEP_COLUMNS)] == ["1"] and "Not yet: this needs both evaluations" in text
    [result] = rows(text, RESULT_COLUMNS)
    before = records(out, "eval_before.jsonl")
    assert result[2] == f"{sum(r['correct'] for r in before) / len(before):.1%}" and result[3:] == ["not scored", "-",
                                                                                                   "-", "-"]


def test_section_1_and_the_table_say_in_words_what_other_settings_ran(tmp_path):
    """A record written by hand with the non-default choices: each one is named in the draft as it ran."""
    config = {"model_path": "/models/Qwen2.5-1.5B-Instruct", "advantage": "drgrpo", "loss_agg": "seq-mean",
              "ppo_epochs": 2, "clip_eps": 0.25, "format_reward": 0.2, "strict_answer": True,
              "mask_truncated": True, "lr_warmup_steps": 10, "lr_decay": True, "learning_rate": 1e-5,
              "lora_rank": 16, "lora_alpha": 32, "lora_targets": "q_proj,v_proj", "min_signal_groups": 0,
              "kl_coef": 0.0, "max_steps": 50, "dtype": "bfloat16"}
    gh.write_json(tmp_path / "config.json", {"config": config, "argv": []})
    gh.write_json(tmp_path / "summary.json", {"steps": 7})
    text = gh.write_report_draft(tmp_path).read_text()
    assert "- Reward: 1 if the number after the last marker (####, \\boxed{, 'answer is') is the gold, " \
           "else 0, plus 0.2 for a well-formed last line; only the last line's number counts." in text
    assert "A_i = r_i - mean of its group, not divided by the std (Dr. GRPO)." in text
    assert "clip(rho, 0.75, 1.25) A)" in text and "2 updates per batch on the same answers, pi_old their " \
           "log-probabilities before the first; answers cut off at the limit left out." in text
    assert "- Reduction: averaged over each answer's tokens, then over answers (the GRPO paper's); no KL " \
           "penalty." in text
    assert "more batches drawn" not in text          # --min-signal-groups 0: a step per batch
    settings = dict(rows(text, "| setting | value |"))
    assert settings["learning rate; schedule"] == "1e-05; warm-up 10 steps, then linear decay to 0"
    assert settings["weights trained"] == "LoRA rank 16, alpha 32, in q_proj,v_proj"
    assert settings["clip range"] == "0.75 to 1.25" and settings["steps run"] == "7 of 50 at most"
    assert settings["model"] == "Qwen2.5-1.5B-Instruct"
    assert settings["loss reduction"] == "mean per answer, then over answers"
    assert "Missing: the evaluation before training (eval_before.jsonl) and the evaluation after training" in text


def test_a_finished_run_whose_evaluations_were_removed_is_not_sent_to_resume(tmp_path):
    """--resume refuses a finished run: the draft must not tell its user to run it (plots/demo-seed0 keeps no
    eval_*)."""
    gh.write_json(tmp_path / "config.json", {"config": {"model_path": "m", "max_steps": 0}, "argv": []})
    gh.write_json(tmp_path / "summary.json", {"steps": 3, "finished": True})
    text = gh.write_report_draft(tmp_path).read_text()
    assert "and the evaluation after training (eval_after.jsonl); the run finished, so they were removed from its " \
           "folder." in text and "--resume" not in text
    assert dict(rows(text, "| setting | value |"))["steps run"] == "3"      # --max-steps 0: no limit to quote


def test_the_drafts_answers_section_by_hand():
    """Three problems: the table's counts worked out by hand; only flips shown, each answer whole in a fence that a
    run of backticks inside it does not close (the old table cells escaped every mark and joined lines by <br>)."""
    def answer(correct, tokens, truncated, completion):
        return {"question": "What is 1 + 2?", "gold": 3.0, "completion": completion, "tokens": tokens,
                "truncated": truncated, "extracted": 3.0 if correct else None, "correct": correct}
    before = [answer(False, 10, True, "1 + 2 is ```"), answer(True, 4, False, "#### 3"), answer(False, 7, False, "4")]
    after = [answer(True, 6, False, "so\n#### 3"), answer(True, 5, False, "#### 3"), answer(False, 10, True, "4 5")]
    c = {**gh.dataclasses.asdict(gh.RunConfig()), "max_new_tokens": 10}
    lines = "\n".join(gh.draft_sections(c, {}, [], before, after)).splitlines()
    section = lines[lines.index("## 4. Answers before and after"):]
    assert section[2:8] == ["The 3 answers: one is cut off when it reaches the limit of 10 new tokens before its end.",
                            "", "| answers | before | after |", "|---|---|---|", "| cut off | 1 | 1 |",
                            "| mean tokens | 7 | 7 |"]      # (10 + 4 + 7) / 3 and (6 + 5 + 10) / 3
    assert section[8] == "| right, of those that ended in time | 1 of 2 | 2 of 2 |"
    assert "### Wrong before, right after: 1" in section and "### Right before, wrong after: 0" in section
    first = section.index("#### Line 1 of eval_before.jsonl and eval_after.jsonl: gold 3")
    assert section[first + 2:first + 5] == ["```text", "What is 1 + 2?", "```"]
    assert section[first + 6:first + 11] == ["Before: 10 tokens, cut off; answer read: none, wrong.", "",
                                             "````text", "1 + 2 is ```", "````"]
    assert section[first + 12:first + 17] == ["After: 6 tokens, ended; answer read: 3, right.", "", "```text",
                                              "so", "#### 3"] and section[first + 17] == "```"
    assert not any(line.startswith("#### Line 2") or line.startswith("#### Line 3") for line in section)
