"""Is the compiled generation (CompiledGeneration: static KV cache + torch.compile) exact on real weights? (#95)

Qwen2.5-Coder-0.5B-Instruct (tests/build_qwen_coder.py) in fp32 on a CPU, GSM8K train problems 0-15 in the runs'
chat prompt (no test problem is looked at), 256 new tokens:
1. greedy: the compiled path's tokens against today's (dynamic cache), row by row;
2. sampled at T 0.7 (4 problems x 4 samples): the log-probs the compiled sampler drew each token with, against
   compute_logprobs_from_model's on the same sequences (the scorer-agreement tolerance, 2e-4).
Part 2 ran this CPU out of memory (24 GB) twice, the instrumentation's doing (notes.md); exact.txt holds part 1.
Writes exact.txt beside this file. Run alone (2 CPU cores): python plots/compiled-generation/exact.py MODEL_DIR
(--sampled-only: part 2 alone, keeping part 1's lines of exact.txt)
"""
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
import grpo_homework as gh  # noqa: E402

TOLERANCE = 2e-4


class Recorder:
    """A logits processor, run after the temperature (transformers puts a caller's processors last): at each step
    the log-prob, under the distribution sampled from, of the token the step before drew; one step held at a time
    (the whole logits would be 16 x 256 x 152k floats)."""

    def __init__(self):
        self.held, self.drawn = None, []

    def __call__(self, input_ids, scores):
        if self.held is not None:
            self.drawn.append(self.held.gather(-1, input_ids[:, -1:])[:, 0])
        self.held = scores.float().log_softmax(-1)
        return scores

    def finish(self, last_tokens):
        self.drawn.append(self.held.gather(-1, last_tokens[:, None])[:, 0])
        return torch.stack(self.drawn, 1)                       # [rows, steps]


def sampled(model, tokenizer, ids, mask, compiled, say, problems=4, samples=4):
    """The compiled sampler's own log-probs of the tokens it drew, against compute_logprobs_from_model's."""
    from transformers import LogitsProcessorList
    recorder, plain = Recorder(), compiled.plain
    compiled.plain = lambda **kwargs: plain(**kwargs, logits_processor=LogitsProcessorList([recorder]))
    model.generate = compiled
    torch.manual_seed(1)
    sample = gh.generate_completions(model, tokenizer, ids[:problems], mask[:problems], 256, 0.7, samples,
                                     batch_size=16)
    compiled.plain, P = plain, sample["prompt_length"]
    new = sample["output_ids"][:, P:]
    drawn = recorder.finish(new[:, len(recorder.drawn)])              # [rows, steps taken]
    steps = drawn.shape[1]
    scored = gh.compute_logprobs_from_model(model, sample["output_ids"], sample["attention_mask"], temperature=0.7,
                                            prompt_length=P).detach()[:, P:P + steps]
    keep = sample["completion_mask"][:, P:P + steps].bool()
    gap = (drawn - scored).abs()[keep]
    say(f"sampled at T 0.7 ({problems} problems x {samples}): {int(keep.sum())} tokens; the compiled sampler's "
        f"log-probs vs compute_logprobs_from_model's: max {gap.max().item():.1e}, mean {gap.mean().item():.1e}; "
        f"within {TOLERANCE:g}: {bool(gap.max() <= TOLERANCE)}; fell back: {compiled.failed}")


def main(model_dir: str, sampled_only: bool = False) -> int:
    lines = []
    say = lambda text: (print(text, flush=True), lines.append(text))
    torch.manual_seed(0)
    model, tokenizer = gh.load_model_and_tokenizer(model_dir, torch.device("cpu"), "float32")
    data = gh.TaskDataset("train[:16]", tokenizer, 512, dataset_path=str(HERE.parents[2] / "shared" / "gsm8k"),
                          prompt_style="chat", task=gh.TASKS["gsm8k"])
    batch = gh.collate_prompts([data[i] for i in range(16)], tokenizer)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    plain = model.generate
    compiled = gh.CompiledGeneration(model, lambda: (16,), everywhere=True)
    say(f"{model_dir}: fp32, torch {torch.__version__}; 16 GSM8K train problems, prompts {mask.sum(1).min().item()}-"
        f"{mask.sum(1).max().item()} tokens (padded to {ids.shape[1]}), greedy, 256 new tokens")
    if sampled_only:           # the greedy lines kept from an earlier run in exact.txt
        lines[:] = (HERE / "exact.txt").read_text().splitlines()[:5]
        sampled(model, tokenizer, ids, mask, compiled, say)
        (HERE / "exact.txt").write_text("\n".join(lines) + "\n")
        return 0
    outs = {}
    for name, generate in (("dynamic", plain), ("compiled", compiled), ("compiled again", compiled)):
        model.generate = generate
        t0 = time.perf_counter()
        outs[name] = gh.generate_completions(model, tokenizer, ids, mask, 256, 0.0, 1, batch_size=16)
        say(f"  {name}: {time.perf_counter() - t0:.0f} s, {outs[name]['completion_lengths'].sum().item()} tokens")
    a, b = (outs[n]["output_ids"] for n in ("dynamic", "compiled"))
    same = [torch.equal(x, y) for x, y in zip(a, b)]
    say(f"greedy: {sum(same)} of 16 rows identical token for token (the first differing row: "
        f"{same.index(False) if False in same else '-'}); compiled path fell back: {compiled.failed}")
    (HERE / "exact.txt").write_text("\n".join(lines) + "\n")

    sampled(model, tokenizer, ids, mask, compiled, say)
    (HERE / "exact.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--sampled-only" in sys.argv))
