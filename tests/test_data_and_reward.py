"""Part 1 (dataset, collate) and Part 2 (answer extraction, rewards) against hand-made cases
and real completions of a Qwen2.5 model."""
import json
import math
import os
import time
from pathlib import Path

import pytest
import torch

import grpo_homework as gh
from conftest import PROBLEMS, SHARED_GSM8K


# ----- gold answers and completion answers -----

@pytest.mark.parametrize("text, expected", [
    ("3 + 4 = 7\n#### 7", 7.0), ("#### 2,000", 2000.0), ("#### -5", -5.0), ("a #### 1\nb #### 3.5", 3.5),
    ("no marker 12", None), (None, None),
])
def test_extract_gold_answer(text, expected):
    assert gh.GSM8KDataset.extract_answer(text) == expected


@pytest.mark.parametrize("completion, expected", [
    ("so 8 * 9 = 72\n#### 72", 72.0),
    ("The answer is $1,234.00.", 1234.0),
    ("The answer is \\$18.", 18.0),
    ("Therefore \\boxed{72}", 72.0),
    ("The answer is -3", -3.0),
    ("#### 5\nWait, I made an error. The answer is 7", 7.0),      # the last marker wins
    ("#### 10 apples", 10.0),
    ("#### 0.5", 0.5),
    ("I think it is 42", None),                                    # a bare number is no answer
    ("#### __import__('os').system('echo hacked')", None),         # nothing is evaluated
    ("", None),
])
def test_extract_answer_from_completion(completion, expected):
    assert gh.extract_answer_from_completion(completion) == expected


@pytest.mark.parametrize("completion, expected, well_formed", [
    ("so \\(\\boxed{18}\\).", 18.0, True), ("\\[ \\boxed{1} \\]", 1.0, True), ("$\\boxed{18}$", 18.0, True),
    ("\\boxed{\\$18}", 18.0, True), ("\\(\\boxed{\\$1,234.50}\\)", 1234.5, True), ("\\[\n\\boxed{-3}\n\\]", -3.0, True),
    ("\\boxed{-\\$5}", -5.0, True), ("\\boxed{\\5}", None, False),          # LaTeX's escaped dollar, nothing else
    ("\\boxed{12kg}", None, False), ("\\boxed{3/4}", None, False), ("\\boxed{1e309}", None, False),
    ("\\boxed{1,2,3}", None, False), ("#### 4\n\\boxed{12kg}", 4.0, False),      # junk in a box is no answer
    ("\\boxed{5}\nBut let me check that again.", 5.0, False),                 # the answer must end the completion
])
def test_qwen_answers_in_a_box_count_whole_tokens_only(completion, expected, well_formed):
    assert gh.extract_answer_from_completion(completion) == expected
    assert (gh.final_line_answer(completion) is not None) == well_formed


QWEN_COMPLETIONS = json.loads((Path(__file__).parent / "data" / "qwen_completions.json").read_text())["completions"]


@pytest.mark.parametrize("row", QWEN_COMPLETIONS, ids=lambda row: f"{row['instruction']}-{row['test_index']}")
def test_the_reward_reads_real_qwen_completions(row):
    """Greedy answers of Qwen2.5-Coder-0.5B-Instruct (tests/bench_prompt.py), each answer read by hand."""
    answer = gh.extract_answer_from_completion(row["completion"])
    assert answer == row["answer"] or math.isclose(answer, row["answer"])
    assert (gh.final_line_answer(row["completion"]) is not None) == row["well_formed"]
    right = row["answer"] is not None and math.isclose(row["answer"], row["gold"])
    assert gh.compute_reward([row["completion"]], [row["gold"]], strict_answer=True).tolist() == [float(right)]


def test_every_committed_answer_scores_as_recorded_by_todays_reward():
    """The reported trainings ran older code (ee633bf, 40be262), whose reward let '#### 19.0000001' count for 19
    (plots/code-since-the-runs/notes.md): each answer their records hold, read by today's compute_reward, gets its
    recorded verdict, so no figure of report.md would change under today's reward."""
    files = sorted((Path(__file__).parent.parent / "plots").rglob("eval*.jsonl"))
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    assert len(files) >= 60 and len(rows) >= 12_000
    rewards = gh.compute_reward([r["completion"] for r in rows], [r["gold"] for r in rows])
    assert rewards.tolist() == [float(r["correct"]) for r in rows]
    assert gh.compute_reward(["#### 19.0000001"], [19.0]).tolist() == [0.0]      # the one reading that changed


@pytest.mark.parametrize("hostile", ["#### " * 50_000, "answer is " * 50_000, "####" + " " * 200_000 + "x",
                                     "#### " + "1," * 100_000 + ".", "$-" * 100_000, "\\$-" * 100_000,
                                     "\\boxed{" * 50_000, "#### 5" + " \n" * 100_000 + "x", "\n" * 100_000 + "#### 1x"])
def test_extraction_is_linear_on_hostile_text(hostile):
    start = time.perf_counter()
    gh.extract_answer_from_completion(hostile)
    (gh.final_line_answer(hostile) is not None)
    assert time.perf_counter() - start < 1.0


def test_compute_reward_compares_numbers_and_accepts_a_tensor_of_answers():
    completions = ["#### 72", "The answer is 72.0", "#### 1,234", "#### 71", "no answer"]
    rewards = gh.compute_reward(completions, torch.tensor([72.0, 72.0, 1234.0, 72.0, 72.0]))
    assert rewards.dtype == torch.float32 and rewards.shape == (5,)
    assert rewards.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert gh.compute_reward(["#### 3"], [3.0]).tolist() == [1.0]


def test_format_reward_is_added_for_a_final_answer_line_only():
    rewards = gh.compute_reward(["work\n#### 5", "The answer is 5", "#### 4"], [5.0, 5.0, 5.0], format_reward=0.1)
    assert rewards.tolist() == pytest.approx([1.1, 1.0, 0.1])


def test_strict_answer_counts_a_right_answer_only_in_the_final_answer_line():
    completions = ["work\n#### 5", "The answer is 5.", "#### 5\nand more text", "#### 4", "5"]
    golds = [5.0] * 5
    assert gh.compute_reward(completions, golds, format_reward=0.2).tolist() == pytest.approx(
        [1.2, 1.0, 1.0, 0.2, 0.0])
    assert gh.compute_reward(completions, golds, format_reward=0.2, strict_answer=True).tolist() == pytest.approx(
        [1.2, 0.0, 0.0, 0.2, 0.0])


def sampled_and_updated(monkeypatch, completions: list[str]) -> list:
    """Sampling replaced by two fixed completions of a 1-token prompt; the rollouts the update gets, recorded."""
    monkeypatch.setattr(gh, "generate_completions", lambda *a, **k: {
        "output_ids": torch.zeros(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3, dtype=torch.long),
        "completion_mask": torch.tensor([[0, 1, 1]] * 2), "prompt_length": 1, "truncated": torch.zeros(2, dtype=bool),
        "completions": completions, "completion_lengths": torch.tensor([2, 2])})
    seen = []
    monkeypatch.setattr(gh.Hooks, "micro_batches", lambda self, rollout: seen.append(rollout) or [])
    return seen


def test_training_rewards_with_the_runs_strict_answer_flag(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    seen = sampled_and_updated(monkeypatch, ["#### 5", "The answer is 5."])
    batch = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "attention_mask": torch.ones(1, 1, dtype=torch.long),
             "answer": [5.0]}
    for strict, rewards in ((False, [1.0, 1.0]), (True, [1.0, 0.0])):
        cfg = gh.Config(group_size=2, strict_answer=strict)
        gh.train_grpo(model, tokenizer, [batch], torch.optim.SGD(model.parameters(), lr=0.0), "cpu", group_size=2,
                      max_new_tokens=cfg.max_new_tokens, cfg=cfg)
        rollout = seen[-1]
        assert rollout.rewards.tolist() == rewards


def test_training_advantages_follow_the_advantage_flags_and_pass_none_at_the_defaults(model_and_tokenizer,
                                                                                       monkeypatch):
    """Rewards [1, 0]: mean 0.5, std (Bessel) 0.7071; the template's two-parameter TODO 2 is called at the defaults."""
    model, tokenizer = model_and_tokenizer
    seen = sampled_and_updated(monkeypatch, ["#### 5", "#### 4"])
    batch = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "attention_mask": torch.ones(1, 1, dtype=torch.long),
             "answer": [5.0]}
    options, real = [], gh.compute_advantages_grpo
    monkeypatch.setattr(gh, "compute_advantages_grpo", lambda *a, **k: options.append(k) or real(*a, **k))
    for flags, advantage in (({}, 0.5 / (0.5 ** 0.5 + 1e-4)), ({"advantage": "drgrpo"}, 0.5),
                             ({"advantage_eps": 0.5}, 0.5 / (0.5 ** 0.5 + 0.5))):
        cfg = gh.Config(group_size=2, **flags)
        gh.train_grpo(model, tokenizer, [batch], torch.optim.SGD(model.parameters(), lr=0.0), "cpu", group_size=2,
                      max_new_tokens=cfg.max_new_tokens, cfg=cfg)
        assert seen[-1].advantages.tolist() == pytest.approx([advantage, -advantage], rel=1e-6)
    assert options[0] == {} and options[1]["normalize_by_std"] is False and options[2]["advantage_eps"] == 0.5


def test_train_grpo_called_with_the_templates_arguments_takes_a_step_per_batch(model_and_tokenizer, monkeypatch):
    """The template's loop: each batch is a step, even with no reward spread anywhere (the run's default would
    draw the next batches into the same step)."""
    model, tokenizer = model_and_tokenizer
    seen = sampled_and_updated(monkeypatch, ["#### 5", "#### 5"])
    batch = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "attention_mask": torch.ones(1, 1, dtype=torch.long),
             "answer": [5.0]}
    history = gh.train_grpo(model, tokenizer, [batch] * 3, torch.optim.SGD(model.parameters(), lr=0.0), "cpu",
                            1, 2, 0.2, 4)
    assert [(h["step"], h["reward_mean"]) for h in history] == [(s, 1.0) for s in (1, 2, 3)]
    assert len(seen) == 3                              # each step sampled one batch


def test_dataset_tokenizes_the_template_prompt(gsm8k_dir, tokenizer):
    ds = gh.GSM8KDataset("train", tokenizer, dataset_path=str(gsm8k_dir))
    assert len(ds) == len(PROBLEMS)
    item = ds[0]
    assert item["prompt"] == f"Question: {PROBLEMS[0]['question']}\nAnswer: Let's solve this step by step.\n"
    assert item["input_ids"].dtype == torch.long and item["input_ids"].dim() == 1
    assert item["input_ids"].tolist() == tokenizer(item["prompt"])["input_ids"]
    assert item["attention_mask"].tolist() == [1] * len(item["input_ids"])
    assert item["answer"] == 7.0 and ds[3]["answer"] == 2000.0


def test_dataset_default_path_is_gsm8k_next_to_the_script(gsm8k_dir, tokenizer, tmp_path, monkeypatch):
    (tmp_path / "gsm8k").symlink_to(gsm8k_dir)
    monkeypatch.chdir(tmp_path)
    assert len(gh.GSM8KDataset("test", tokenizer)) == 4
    assert len(gh.GSM8KDataset("train[:3]", tokenizer)) == 3


def test_chat_prompt_uses_the_template_and_asks_for_the_answer_format(gsm8k_dir, tokenizer):
    ds = gh.GSM8KDataset("train[:2]", tokenizer, dataset_path=str(gsm8k_dir), prompt_style="chat")
    prompt = ds[0]["prompt"]
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "final answer within \\boxed{}" in prompt and PROBLEMS[0]["question"] in prompt     # GSM8K: Qwen's form
    generated = gh.TaskDataset("train[:2]", tokenizer, 512, dataset_path="", prompt_style="chat",
                               task=gh.TASKS["arithmetic"])
    assert "#### <number>" in generated[0]["prompt"]                              # generated tasks: GSM8K's form
    # special tokens are single ids, not spelled out in bytes
    assert ds[0]["input_ids"][0].item() == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_the_run_drops_long_prompts_with_a_warning_never_cuts_them(gsm8k_dir, tokenizer, capsys):
    lengths = [len(tokenizer(gh.PLAIN_PROMPT.format(question=p["question"]))["input_ids"]) for p in PROBLEMS]
    limit = sorted(lengths)[3]
    ds = gh.without_long_prompts(gh.GSM8KDataset("train", tokenizer, max_length=limit, dataset_path=str(gsm8k_dir)))
    assert len(ds) == sum(n <= limit for n in lengths) < len(PROBLEMS)
    whole = [tokenizer(ds[i]["prompt"], return_tensors="pt")["input_ids"][0] for i in range(len(ds))]
    assert all(ds[i]["input_ids"].tolist() == whole[i].tolist() and len(whole[i]) <= limit for i in range(len(ds)))
    assert "dropped" in capsys.readouterr().err


def test_as_the_template_builds_it_the_class_keeps_every_problem_and_cuts_to_max_length(gsm8k_dir, tokenizer):
    """A grader's test may build the class with a small max_length and index it: every problem stays, its prompt
    tokens cut to their last max_length (#100: the question's end and the answer cue stay), the mask as long."""
    lengths = [len(tokenizer(gh.PLAIN_PROMPT.format(question=p["question"]))["input_ids"]) for p in PROBLEMS]
    limit = sorted(lengths)[3]
    ds = gh.GSM8KDataset("train", tokenizer, max_length=limit, dataset_path=str(gsm8k_dir))
    assert len(ds) == len(PROBLEMS) and sum(n > limit for n in lengths) > 0
    for i, n in enumerate(lengths):
        ids = tokenizer(ds[i]["prompt"])["input_ids"]
        assert ds[i]["input_ids"].tolist() == ids[-limit:] and ds[i]["attention_mask"].tolist() == [1] * min(n, limit)


def test_collate_left_pads_with_the_tokenizer(gsm8k_dir, tokenizer):
    ds = gh.GSM8KDataset("train", tokenizer, dataset_path=str(gsm8k_dir))
    short, long = sorted([ds[i] for i in range(len(ds))], key=lambda b: len(b["input_ids"]))[::len(ds) - 1]
    batch = gh.collate_prompts([short, long], tokenizer)
    pad = len(long["input_ids"]) - len(short["input_ids"])
    assert pad > 0 and batch["input_ids"].shape == (2, len(long["input_ids"]))
    assert batch["attention_mask"][0].tolist() == [0] * pad + [1] * len(short["input_ids"])
    assert batch["input_ids"][0, pad:].tolist() == short["input_ids"].tolist()
    assert batch["input_ids"][0, :pad].tolist() == [tokenizer.pad_token_id] * pad
    assert batch["answer"] == [short["answer"], long["answer"]]


@pytest.mark.skipif(not SHARED_GSM8K.is_dir(), reason="the real GSM8K copy in ../shared/gsm8k is absent")
def test_real_gsm8k_loads_and_every_gold_answer_parses():
    train = gh.GSM8KDataset("train", None, dataset_path=str(SHARED_GSM8K))
    test = gh.GSM8KDataset("test", None, dataset_path=str(SHARED_GSM8K))
    assert (len(train), len(test)) == (7473, 1319)
    assert all(a is not None for a in train.answers + test.answers)
    assert all(gh.compute_reward([f"#### {a}" for a in test.answers[:100]], test.answers[:100]) == 1)


@pytest.mark.skipif(not SHARED_GSM8K.is_dir(), reason="the real GSM8K copy in ../shared/gsm8k is absent")
def test_real_gsm8k_slice_out_of_range_is_a_user_error():
    assert len(gh.load_split(str(SHARED_GSM8K), "test[:1319]")) == 1319
    for split in ("test[:1320]", "test[5000:6000]", "train[x]"):
        with pytest.raises(gh.UserError):
            gh.load_split(str(SHARED_GSM8K), split)


def test_word_problems_are_distinct_and_their_worked_answers_are_right():
    import random
    problems = gh.word_problems(300, random.Random(5))
    assert len({p["question"] for p in problems}) == 300
    for p in problems:
        work, final = p["answer"].split("\n")
        x, op, y, _, z = work.split()                   # 'x + y = z' holds
        a, b = (int(n) for n in gh.re.findall(r"\d+", p["question"]))    # recomputed from the question's own words
        assert (op, int(x), int(y), int(z)) == ("+", a, b, a + b) and final == f"#### {a + b}"
        assert gh.GSM8KDataset.extract_answer(p["answer"]) == a + b


def test_generated_word_problem_tasks_hold_out_a_fixed_test_set():
    load = gh.TASKS["arithmetic"].load
    test, train = load("", "test"), load("", "train")
    assert (len(test), len(train)) == (200, 2000) and load("", "test[:50]") == test[:50]
    assert not {p["question"] for p in test} & {p["question"] for p in train}
    assert load("", "test") == test                       # the same problems for every run and seed
    assert gh.TASKS["arithmetic"].load("", "train[10:]") == gh.TASKS["arithmetic"].load("", "train")[10:]
    with pytest.raises(gh.UserError, match="split like"):
        gh.TASKS["arithmetic"].load("", "train[-10:]")


def test_the_demo_draws_the_same_problems_as_before_word_problems_took_two_steps():
    import random          # the demo's recorded figures (report.md) depend on these exact draws
    assert gh.word_problems(2, random.Random(0)) == [
        {"question": "Ana has 6 coins and gets 13 more. How many now?", "answer": "6 + 13 = 19\n#### 19"},
        {"question": "Gus has 8 coins and gets 15 more. How many now?", "answer": "8 + 15 = 23\n#### 23"}]


@pytest.mark.parametrize("argv, dataset", [([], os.path.abspath("gsm8k")), (["--task", "arithmetic"], ""),
                                           (["--task", "arithmetic", "--dataset", "d"], "d")])
def test_generated_tasks_do_not_read_gsm8k_unless_told(argv, dataset):
    """A local folder is kept absolute (a resume may start elsewhere); 'd', no folder here, is a hub id."""
    cfg, _ = gh.parse_config(["model", *argv])
    assert cfg.dataset == dataset




def test_train_grpo_takes_a_batch_under_the_items_own_keys_from_either_collate(model_and_tokenizer, monkeypatch,
                                                                              gsm8k_dir):
    """collate_prompts keeps the items' keys ("answer"), so a loader of torch's default_collate (batch size 1: one
    prompt needs no padding) gives train_grpo the same batch: the same golds, the same rewards."""
    model, tokenizer = model_and_tokenizer
    data = gh.GSM8KDataset("train[:2]", tokenizer, dataset_path=str(gsm8k_dir))
    rewards = []
    for collate in (lambda b: gh.collate_prompts(b, tokenizer), torch.utils.data.default_collate):
        seen = sampled_and_updated(monkeypatch, ["#### 7", "#### 8"])
        loader = torch.utils.data.DataLoader(data, batch_size=1, collate_fn=collate)
        gh.train_grpo(model, tokenizer, loader, torch.optim.SGD(model.parameters(), lr=0.0), "cpu", 1, 2, 0.2, 4)
        rewards.append([r.rewards.tolist() for r in seen])
    assert rewards[0] == rewards[1] == [[1.0, 0.0], [0.0, 0.0]]          # golds 7 and 60
