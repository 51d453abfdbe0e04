"""The pipeline on a real pretrained instruct model: SmolLM2-135M-Instruct (Llama architecture, ChatML, a
49,152-token BPE vocabulary, <|im_end|> as both EOS and pad, a template that inserts its own system prompt).

`.ci/run` builds it once with ../shared/tools/smollm2.py into $GRPO_SMOLLM2 (default
~/.cache/grpo-homework/SmolLM2-135M-Instruct). Elsewhere these tests skip when it is absent; in CI they fail.
"""
import json
import os
from pathlib import Path

import pytest
import torch

import grpo_homework as gh
from conftest import SHARED_GSM8K
from test_cli import PROGRESS, run_cli

SMOLLM2 = Path(os.environ.get("GRPO_SMOLLM2") or
               Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo-homework" /
               "SmolLM2-135M-Instruct")
QUESTIONS = ["Tom has 3 apples and buys 4 more. How many apples does he have?",
             "A box holds 12 pens. How many pens are in 5 boxes? Think about it carefully before answering."]


@pytest.fixture(scope="module")
def smollm2():
    if not (SMOLLM2 / "config.json").is_file():
        message = f"SmolLM2-135M-Instruct not built at {SMOLLM2}: python ../shared/tools/smollm2.py {SMOLLM2}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must build the real model first ({message})")
        pytest.skip(message)
    torch.manual_seed(0)
    return gh.load_model_and_tokenizer(str(SMOLLM2), torch.device("cpu"), "float32")


def chat_batch(tokenizer):
    """Two chat prompts of different lengths, left-padded as the pipeline pads them."""
    items = []
    for q in QUESTIONS:
        ids = torch.tensor(tokenizer(gh.build_prompt(q, tokenizer, "chat"), add_special_tokens=False)["input_ids"])
        items.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "prompt": q, "question": q,
                      "answer": 0.0})
    return gh.collate_prompts(items, tokenizer)


def test_the_prompt_carries_our_instruction_instead_of_smollms_default(smollm2):
    _, tokenizer = smollm2
    prompt = gh.build_prompt(QUESTIONS[0], tokenizer, "chat")
    assert gh.GSM8K_INSTRUCTION in prompt and "named SmolLM" not in prompt
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert prompt.count("<|im_start|>") == 3


def sampled_and_scored(model, tokenizer):
    """Sample 2 x 2 completions at T 0.7, score them, and check the scorer's log-probs against the sampler's;
    return (sequences, full mask, prompt length, the scorer's log-probs, the valid positions)."""
    from bench_scorer import sample_and_score
    batch = chat_batch(tokenizer)
    assert (batch["attention_mask"][:, 0] == 0).any(), "one prompt must be left-padded"
    sequences, full_mask, prompt_length, scored, sampler, valid = sample_and_score(
        model, tokenizer, batch, samples=2, new_tokens=12, seed=1)
    assert valid.sum() >= 20
    torch.testing.assert_close(scored[valid], sampler[valid], rtol=0, atol=2e-4)
    return sequences, full_mask, prompt_length, scored, valid


def test_scorer_logprobs_equal_the_samplers_on_real_weights_with_left_padding(smollm2):
    """What generate sampled from (its processed scores: logits / T, nothing else) is what the loss scores; and
    the scorer equals the handout's formula over the whole padded batch (every position's logits)."""
    from test_grpo import handout_logprobs
    model, tokenizer = smollm2
    sequences, full_mask, prompt_length, scored, valid = sampled_and_scored(model, tokenizer)
    with torch.no_grad():
        handout = handout_logprobs(model, sequences, full_mask, 0.7, prompt_length)[:, prompt_length:]
    torch.testing.assert_close(handout[valid], scored[valid], rtol=0, atol=5e-5)


def test_a_right_padded_batch_samples_and_scores_as_its_left_padded_self(smollm2):
    """#99: a right-padded loader's rows were sampled with generate()'s positions for right padding (3 nats from
    what TODO 4 then scored on SmolLM2); the sampler now puts the pads first, so both paddings give the same rows."""
    model, tokenizer = smollm2
    questions = ["Question: Tom has 3 apples and buys 4 more. How many apples?\nAnswer:", "Question: 2 + 2?\nAnswer:"]
    out = {}
    for side in ("left", "right"):
        batch = tokenizer(questions, padding=True, padding_side=side, return_tensors="pt")
        out[side] = gh.generate_completions(model, tokenizer, batch["input_ids"], batch["attention_mask"], 12, 0.0, 1)
    assert out["left"]["completions"] == out["right"]["completions"]
    assert torch.equal(out["left"]["output_ids"], out["right"]["output_ids"])
    assert torch.equal(out["left"]["attention_mask"], out["right"]["attention_mask"])


def test_under_lora_the_scorer_still_scores_what_the_sampler_sampled(smollm2):
    """peft's adapters sit in the body's linear layers, which generate and the scorer both run."""
    pytest.importorskip("peft")
    _, tokenizer = smollm2
    model = gh.load_model_and_tokenizer(str(SMOLLM2), torch.device("cpu"), "float32")[0]
    model = gh.with_lora(model, gh.RunConfig(lora_rank=8, lora_alpha=16), None)
    torch.manual_seed(2)
    with torch.no_grad():                                # adapters that move the distribution (B starts at 0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    base = gh.load_model_and_tokenizer(str(SMOLLM2), torch.device("cpu"), "float32")[0]
    ids = chat_batch(tokenizer)["input_ids"][:1]
    with torch.no_grad():
        assert (model(ids).logits - base(ids).logits).abs().max() > 0.1, "the adapters must change the logits"
    sampled_and_scored(model, tokenizer)


def test_completion_masks_end_at_the_first_im_end(smollm2):
    model, tokenizer = smollm2
    batch = chat_batch(tokenizer)
    torch.manual_seed(0)
    out = gh.generate_completions(model, tokenizer, batch["input_ids"], batch["attention_mask"],
                                  max_new_tokens=48, temperature=1.0, num_samples=4)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in gh.eos_token_ids(model, tokenizer) and tokenizer.pad_token_id == im_end
    prompt_length = out["prompt_length"]
    new_ids = out["output_ids"][:, prompt_length:]
    mask = out["completion_mask"][:, prompt_length:]
    ended = 0
    for row, m, text, cut in zip(new_ids.tolist(), mask.tolist(), out["completions"], out["truncated"].tolist()):
        if cut:
            assert all(m) and im_end not in row
            continue
        ended += 1
        first = row.index(im_end)
        assert m == [1] * (first + 1) + [0] * (len(row) - first - 1)          # the EOS counts, padding does not
        assert "<|im_end|>" not in text and text == tokenizer.decode(row[:first], skip_special_tokens=True)
    assert ended >= 1, "some completion should end within 48 tokens"


@pytest.mark.skipif(not SHARED_GSM8K.is_dir(), reason="the real GSM8K is not in ../shared/gsm8k")
def test_a_two_step_cli_run_on_real_gsm8k_writes_the_whole_record(smollm2, tmp_path):
    """With the homework's signal filling: a step draws batches until --batch-size (1) group has reward spread,
    at most --max-draws 1 further one (SmolLM2 seldom finishes a GSM8K answer in 16 tokens, so both steps usually
    draw 2). The default 4 further draws made this test 49 s on an AVX2 CPU, 30 of them sampling."""
    out = tmp_path / "run"
    result = run_cli([str(SMOLLM2), "--dataset", str(SHARED_GSM8K), "--output-dir", str(out), "--device", "cpu",
                      "--train-size", "10", "--eval-size", "2", "--batch-size", "1", "--group-size", "4",
                      "--max-new-tokens", "16", "--generation-batch-size", "4", "--max-steps", "2", "--max-draws", "1",
                      "--temperature", "0.7", "--learning-rate", "1e-5", "--lr-warmup-steps", "0", "--dtype",
                      "float32"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert [line for line in result.stdout.splitlines() if line in PROGRESS] == PROGRESS
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["samples"] == 4 * m["prompts_drawn"] and m["prompts_drawn"] <= 2 for m in metrics)
    assert all(m["signal_groups"] == 1 or m["prompts_drawn"] == 2 for m in metrics)
    assert metrics[-1]["batch_in_epoch"] == sum(m["prompts_drawn"] for m in metrics)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 2 and "accuracy_after" in summary
    for name in ("eval_before.jsonl", "eval_after.jsonl"):
        records = [json.loads(line) for line in (out / name).read_text().splitlines()]
        assert len(records) == 2 and records[0]["question"].startswith("Janet")     # GSM8K test row 0
    assert (out / "report_draft.md").exists() and (out / "plots" / "reward.png").exists()
    assert (out / "checkpoints" / "step-2" / "trainer_state.safetensors").exists()
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(out / "final").eos_token == "<|im_end|>"
    assert (out / "final" / "model.safetensors").stat().st_size > 500e6


def test_smollm2_learns_the_arithmetic_task_under_lora(smollm2, tmp_path):
    """A learning threshold under LoRA (--lora-rank 16) at the rate chosen for it on the validation split, 1e-3
    (plots/smollm2-lora/notes.md): the SmolLM2 recipe's 8 prompts x 8 cut to 5 steps, in which the policy learns to
    answer '#### N' within 40 tokens (at 32 tokens no sample finishes, so nothing is learnt). Measured alone on
    2026-11-27: sampled reward 0.006, 0.009, 0.059, 0.153, 0.338; greedy accuracy on 16 held-out problems 12.5% ->
    56.25% (8 gained, 1 lost); 207 s through the CLI, 195 s in the suite. A sixth step (this test until 2026-11-27:
    225 s in the suite) reached 0.472 and 87.5%; cut for the suite's 10 minutes.
    Seed 0 is every recorded SmolLM2 run's; seed 1 reaches sampled reward 0.40 by step 6 but greedy 12.5% still: a
    threshold of one seed, not of every seed. With 4 prompts a step (this test until 2026-11-26; the seq-mean loss
    then gives one lucky group twice the weight) seed 0 ended at 0% greedy, every answer '#### 2', and seed 1's
    reward fell to 0 after a step. fp32 on purpose: in bf16 (tried alone for speed on 2026-11-26) seed 0 stayed at
    6.25% greedy, its sampled reward 0.006 -> 0.253 in 6 steps; at lr 2e-3 (2026-11-27) 6.25% -> 0%, and no faster.
    Cheaper variants tried alone on an AVX2-only CPU (2026-11-27, where this test takes 300-380 s; same rewards as
    above to the digit): group size 4 (133 s) and 6 prompts (215 s) left greedy at 25% and 31% (no group had reward
    spread in the first 2-3 steps); 48 tokens for 4 steps (347 s) reached reward 0.37 but greedy 25% (3 / 2)."""
    pytest.importorskip("peft")
    out = tmp_path / "run"
    assert gh.main([str(SMOLLM2), "--task", "arithmetic", "--device", "cpu", "--batch-size", "8", "--group-size", "8",
                    "--max-new-tokens", "40", "--temperature", "0.7", "--learning-rate", "1e-3", "--lr-warmup-steps",
                    "0", "--max-steps", "5", "--format-reward", "0.2", "--strict-answer", "--eval-size", "16",
                    "--eval-batch-size", "16", "--generation-batch-size", "64", "--micro-batch-size", "16",
                    "--plot-every", "0", "--show-examples", "0", "--lora-rank", "16", "--lora-alpha", "32",
                    "--loss-agg", "seq-mean", "--min-signal-groups", "0", "--dtype", "float32", "--output-dir",
                    str(out)]) == 0
    rewards = [json.loads(line)["reward_mean"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert len(rewards) == 5 and sum(rewards[-2:]) / 2 - sum(rewards[:2]) / 2 >= 0.2, rewards
    assert summary["accuracy_after"] - summary["accuracy_before"] >= 0.25, summary
    assert (out / "final" / "adapter" / "adapter_model.safetensors").exists()
