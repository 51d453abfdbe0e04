"""Shared fixtures: a tiny real Qwen2 model and tokenizer on disk, and a few GSM8K-format problems in hub layout."""
import os
import random
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpo_homework as gh  # noqa: E402

SHARED_GSM8K = ROOT.parent / "shared" / "gsm8k"

# A deprecation our own code triggers fails the suite, in-process and in the CLI runs (the script is __main__ there):
# on the newest transformers it is the API that goes away next.
OUR_DEPRECATIONS = ",".join(f"error::{kind}:{module}" for kind in ("FutureWarning", "DeprecationWarning")
                            for module in ("grpo_homework", "__main__"))


def cli_env(**extra: str) -> dict:
    """The environment of a CLI subprocess: output unbuffered, no progress bars, our deprecations errors."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", "PYTHONWARNINGS": OUR_DEPRECATIONS, **extra}


def pytest_configure(config):
    for spec in OUR_DEPRECATIONS.split(","):
        config.addinivalue_line("filterwarnings", spec)

def update_once(model, optimizer, rollout, cfg, ref_model=None, hooks=None) -> dict:
    """train_grpo's step on a rollout made here, as a run takes it (UpdateHooks, or `hooks`): its sampling, reward,
    advantages and Rollout.of hand back the rollout's own, so train_grpo's body runs the update on it. The step's
    record, with the update's statistics."""
    from unittest import mock
    batch = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "attention_mask": torch.ones(1, 1, dtype=torch.long),
             "answer": [0.0]}
    hooks = hooks or gh.UpdateHooks(cfg, optimizer, ref_model, model=model)
    with mock.patch.object(gh, "generate_completions", lambda *a, **k: {"completions": rollout.completions}), \
            mock.patch.object(gh, "compute_reward", lambda *a, **k: rollout.rewards), \
            mock.patch.object(gh, "compute_advantages_grpo", lambda *a, **k: rollout.advantages), \
            mock.patch.object(gh.Rollout, "of", lambda *a, **k: rollout):
        return gh.train_grpo(model, None, [batch], optimizer, "cpu", cfg.num_epochs, cfg.group_size, cfg.clip_eps,
                             cfg.max_new_tokens, cfg=cfg, hooks=hooks)[0]


# Hand-written, GSM8K style: reasoning, then '#### <number>' (one with a thousands separator).
PROBLEMS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A box holds 12 pens. How many pens are in 5 boxes?", "answer": "12 * 5 = <<12*5=60>>60\n#### 60"},
    {"question": "Sara had 20 dollars and spent 8. How much is left?", "answer": "20 - 8 = <<20-8=12>>12\n#### 12"},
    {"question": "A farm sells 1,000 eggs a day for 2 days. How many eggs?", "answer": "1000 * 2 = 2000\n#### 2,000"},
    {"question": "Ann reads 6 pages a day for 7 days. How many pages?", "answer": "6 * 7 = <<6*7=42>>42\n#### 42"},
    {"question": "There are 9 birds and 4 fly away. How many remain?", "answer": "9 - 4 = <<9-4=5>>5\n#### 5"},
    {"question": "Ben splits 18 cookies among 3 friends. How many each?", "answer": "18 / 3 = <<18/3=6>>6\n#### 6"},
    {"question": "A car goes 50 miles an hour for 3 hours. How far?", "answer": "50 * 3 = 150\n#### 150"},
]


@pytest.fixture(scope="session")
def gsm8k_dir(tmp_path_factory):
    return gh.write_hub_dataset(tmp_path_factory.mktemp("gsm8k"), {"train": PROBLEMS, "test": PROBLEMS[:4]})


QWEN_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="session")
def tokenizer():
    """The demo's byte tokenizer with Qwen's chat markup, so that the chat path renders roles as Qwen does."""
    return gh.build_byte_tokenizer(chat_template=QWEN_CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer):
    """A randomly initialized Qwen2ForCausalLM saved with save_pretrained, so from_pretrained really runs."""
    path = tmp_path_factory.mktemp("tiny-qwen2")
    model = gh.build_tiny_model(tokenizer, seed=0, hidden=32, layers=2)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def model_and_tokenizer(model_dir):
    torch.manual_seed(0)
    return gh.load_model_and_tokenizer(str(model_dir), torch.device("cpu"), "float32")


@pytest.fixture(scope="session")
def addition_dir(tmp_path_factory):
    rng = random.Random(0)
    test = gh.word_problems(16, rng)
    train = gh.word_problems(64, rng, exclude={p["question"] for p in test})
    return gh.write_hub_dataset(tmp_path_factory.mktemp("addition"), {"train": train, "test": test})


@pytest.fixture(scope="session")
def warm_model_dir(tmp_path_factory, tokenizer):
    """The demo's model after a short supervised warm-up: right sometimes, so GRPO has reward to learn from."""
    path = tmp_path_factory.mktemp("warm-qwen2")
    model = gh.build_tiny_model(tokenizer, seed=0)
    problems = gh.word_problems(500, random.Random(1))
    gh.supervised_warmup(model, tokenizer, problems, gh.DemoConfig(warmup_max_steps=100, warmup_target=0.15), seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
