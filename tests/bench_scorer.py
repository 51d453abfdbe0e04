"""Does the loss score what the sampler sampled, on real weights? Side by side for bf16 and fp32, one run.

For a real Qwen2.5 model folder (tests/build_qwen_coder.py builds the 0.5B and the 1.5B), GSM8K prompts of different
lengths, left-padded as the pipeline pads them, are sampled at T 0.7 with generate() (output_scores: the processed
scores it sampled from, logits / T and nothing else) and then scored by TODO 4 (compute_logprobs_from_model) on the
whole padded rows. Printed per weight precision: how many completion tokens were compared and the largest and mean
absolute difference between the two log-probs of each sampled token (up to and including each row's first EOS).
The suite holds SmolLM2 to 2e-4 in fp32 (tests/test_real_model.py); this measures the homework's own shape.

Not collected by pytest. Needs GSM8K in hub layout (../shared/gsm8k or --dataset):
    python tests/bench_scorer.py MODEL_DIR [--prompts 4] [--samples 2] [--max-new-tokens 64]
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402


def no_grad_eval(model):
    """Eval mode and no gradient, as the run scores and generates."""
    model.eval()
    return torch.no_grad()


def sample_and_score(model, tokenizer, batch, samples: int, new_tokens: int, temperature: float = 0.7,
                     seed: int = 0):
    """Sample `samples` completions per prompt with generate() and score them with TODO 4. Returns the sequences,
    the full mask, the prompt length, TODO 4's and the sampler's log-prob of each sampled token ([rows, new]) and
    the positions to compare: up to and including each row's first EOS (after it, generate writes only pads)."""
    eos = gh.eos_token_ids(model, tokenizer)
    config = gh.sampling_config(temperature, new_tokens, eos, tokenizer.pad_token_id)
    config.update(output_scores=True, return_dict_in_generate=True)   # in the config: beside it, deprecated
    ids = batch["input_ids"].repeat_interleave(samples, 0)
    mask = batch["attention_mask"].repeat_interleave(samples, 0)
    torch.manual_seed(seed)
    with no_grad_eval(model):
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        prompt = ids.shape[1]
        sampled = out.sequences[:, prompt:]                                                # [rows, new]
        sampler = torch.stack([s.float().log_softmax(-1) for s in out.scores], 1)          # [rows, new, vocab]
        sampler = sampler.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)                   # [rows, new]
        full_mask = torch.cat([mask, torch.ones_like(sampled)], 1)
        scored = gh.compute_logprobs_from_model(model, out.sequences, full_mask, temperature=temperature,
                                                prompt_length=prompt)[:, prompt:]          # [rows, new]
    is_eos = torch.isin(sampled, torch.tensor(eos))
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), sampled.shape[1])
    valid = torch.arange(sampled.shape[1])[None] <= first[:, None]                         # [rows, new]
    return out.sequences, full_mask, prompt, scored, sampler, valid


def compare(model, tokenizer, batch, samples: int, new_tokens: int) -> dict:
    _, full_mask, _, scored, sampler, valid = sample_and_score(model, tokenizer, batch, samples, new_tokens)
    gap = (scored - sampler)[valid].abs()
    return {"tokens": int(valid.sum()), "max": gap.max().item(), "mean": gap.mean().item(),
            "left_padded_rows": int((full_mask[:, 0] == 0).sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--dataset", default=str(Path(__file__).resolve().parents[2] / "shared" / "gsm8k"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"{args.model}: {args.prompts} GSM8K test prompts x {args.samples} samples x {args.max_new_tokens} new "
          f"tokens at T 0.7; |TODO 4's log-prob - the sampler's| per sampled token")
    print(f"{'weights':<10}{'tokens':>8}{'left-padded rows':>18}{'max':>12}{'mean':>12}{'seconds':>9}")
    for dtype in ("bfloat16", "float32"):
        model, tokenizer = gh.load_model_and_tokenizer(args.model, torch.device("cpu"), dtype)
        data = gh.GSM8KDataset(f"test[:{args.prompts}]", tokenizer, dataset_path=args.dataset, prompt_style="chat")
        batch = gh.collate_prompts([data[i] for i in range(len(data))], tokenizer)
        t0 = time.perf_counter()
        r = compare(model, tokenizer, batch, args.samples, args.max_new_tokens)
        print(f"{dtype:<10}{r['tokens']:>8}{r['left_padded_rows']:>18}{r['max']:>12.2e}{r['mean']:>12.2e}"
              f"{time.perf_counter() - t0:>9.0f}")
        del model


if __name__ == "__main__":
    main()
