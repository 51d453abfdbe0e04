r"""GRPO on GSM8K: train an instruct LLM (Qwen2.5-1.5B-Instruct) to solve grade-school math, on one CUDA GPU.

The policy samples a group of completions per problem, each rewarded 1 when its last marked answer is the gold, and
takes a PPO-style clipped step on advantages relative to its group (README.md: the choices; report.md: results).

    python grpo_homework.py --demo               # a tiny model learns addition on a CPU in minutes
    python grpo_homework.py MODEL_PATH           # the homework run: GSM8K in ./gsm8k, one 24 GB GPU
    python grpo_homework.py --resume RUN_DIR     # finish a stopped run, or train a finished one further
    python grpo_homework.py --report RUN_DIR     # redraw a run's plots and report_draft.md

The homework (Configuration, Parts 1-4 with TODOs 1-5, Part 5: main) ends at the banner "WHAT SUPPORTS THE RUN".
Below it is what a real run adds; that reaches train_grpo only through Hooks.
"""

import math
import os
import re
import signal
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")   # Ctrl-C; kill, docker stop, Slurm's time limit; a closed terminal
for _name in STOP_SIGNALS if __name__ == "__main__" else ():   # a stop while torch loads: one line, no traceback
    signal.signal(getattr(signal, _name), lambda *_: (print("error: interrupted while starting; nothing was written",
                                                            file=sys.stderr), os._exit(2)))
import torch
import torch.nn.functional as F
from torch.nn.utils import clip_grad_norm_
from torch.utils.data import DataLoader, Dataset


# ===== Configuration: declared once, here (a run's own settings extend it below the banner: RunConfig) ============

def _flag(default: Any, doc: str, **argparse_kwargs: Any) -> Any:
    return field(default=default, metadata={"help": doc, **argparse_kwargs})


@dataclass
class Config:
    # the template's hyperparameters
    model_path: str = _flag("", "model directory or hub id (Qwen2.5-1.5B-Instruct for the homework)")
    dataset: str = _flag("./gsm8k", "hub-layout folder or hub id; '' = the task's generated problems (not gsm8k)")
    batch_size: int = _flag(4, "prompts per step")
    group_size: int = _flag(16, "completions sampled per prompt (the G of GRPO)")
    max_new_tokens: int = _flag(256, "the token limit: new tokens per completion, in training and in the evaluations")
    temperature: float = _flag(0.7, "sampling temperature; log-probs divide logits by the same value")
    learning_rate: float = _flag(2e-6, "AdamW learning rate")
    num_epochs: int = _flag(1, "passes over the training problems")
    clip_eps: float = _flag(0.2, "PPO clip range: ratios outside [1 - eps, 1 + eps] are clipped")
    # the objective: the GRPO paper's (DeepSeekMath) advantages; Dr. GRPO's form is an option
    advantage: str = _flag("grpo", "grpo: (r - mean) / (std + eps); drgrpo: r - mean", choices=["grpo", "drgrpo"])
    advantage_eps: float = _flag(1e-4, "added to the group std before dividing")
    format_reward: float = _flag(0.0, "reward added for a well-formed final answer line")
    strict_answer: bool = _flag(False, "reward an answer only in the well-formed final line, not anywhere")
    mask_truncated: bool = _flag(False, "leave completions cut at --max-new-tokens out of the loss")
    max_grad_norm: float = _flag(1.0, "gradient clipping norm")
    # how much runs at once: memory, not arithmetic
    eval_batch_size: int = _flag(32, "prompts per generate call in evaluation")

    @property
    def reward_options(self) -> dict:       # none at the defaults: the template's compute_reward(completions, golds)
        return {"format_reward": self.format_reward, "strict_answer": self.strict_answer} if (
            self.format_reward or self.strict_answer) else {}

    @property
    def advantage_options(self) -> dict:    # none at the defaults: the template's compute_advantages_grpo(rewards, G)
        return {"normalize_by_std": self.advantage == "grpo", "advantage_eps": self.advantage_eps} if (
            self.advantage != "grpo" or self.advantage_eps != Config.advantage_eps) else {}


# ===== Part 1: dataset =============================================================================================

PLAIN_PROMPT = "Question: {question}\nAnswer: Let's solve this step by step.\n"          # the template's prompt
GSM8K_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."   # Qwen2.5's own


def build_prompt(question: str, tokenizer=None, style: str = "plain", instruction: str = GSM8K_INSTRUCTION) -> str:
    """style "plain": the template's prompt; "chat" (the runs'): the tokenizer's chat template with `instruction` as
    the system message, Qwen2.5-Instruct's own request for the answer in \\boxed{}."""
    if style == "chat":
        messages = [{"role": "system", "content": instruction}, {"role": "user", "content": question}]
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:      # a template with no system role (Gemma's raises): the instruction opens the user turn
            messages = [{"role": "user", "content": f"{instruction}\n\n{question}"}]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    plain = PLAIN_PROMPT.format(question=question)
    return plain if instruction == GSM8K_INSTRUCTION else f"{instruction}\n\n{plain}"


class GSM8KDataset(Dataset):
    """GSM8K problems as prompts (built by build_prompt) and gold numbers; items are tokenized, unpadded."""

    def __init__(self, split="train", tokenizer=None, max_length=512, *, dataset_path="./gsm8k", prompt_style="plain"):
        import datasets
        # The template's load_dataset(path, "main"); a folder without the hub's README.md has no config "main"
        config = "main" if "main" in datasets.get_dataset_config_names(dataset_path) else None
        with tempfile.TemporaryDirectory() as cache:          # datasets keys a folder's cache on its name alone
            data = datasets.load_dataset(dataset_path, config, split=split, **(
                {"cache_dir": cache, "keep_in_memory": True} if Path(dataset_path).is_dir() else {}))
        golds = [self.extract_answer(answer) for answer in data["answer"]]
        self.rows = [i for i, gold in enumerate(golds) if gold is not None]    # no gold number: nothing to reward
        if len(self.rows) < len(golds):
            print(f"warning: {split}: dropped row(s) {sorted(set(range(len(golds))) - set(self.rows))[:5]} whose "
                  f"answer has no '#### <number>' (one a float holds exactly)", file=sys.stderr)
        self.questions, self.answers = [data["question"][i] for i in self.rows], [golds[i] for i in self.rows]
        self.prompts = [build_prompt(q, tokenizer, prompt_style) for q in self.questions]
        self.tokenizer, self.max_length, self.prompt_style = tokenizer, max_length, prompt_style

    def __len__(self):
        return len(self.prompts)

    # ----- TODO 1: tokenize a prompt -----
    def __getitem__(self, idx):
        """The prompt's tokens, unpadded; a prompt over max_length keeps its last max_length tokens (its answer cue)."""
        # A chat template writes any BOS token itself, so the tokenizer adds none to a chat prompt
        encoded = self.tokenizer(self.prompts[idx], add_special_tokens=self.prompt_style != "chat", return_tensors="pt")
        tail = slice(-self.max_length, None)   # a long prompt's start goes; the end, which asks for the answer, stays
        return {"input_ids": encoded["input_ids"][0, tail], "attention_mask": encoded["attention_mask"][0, tail],
                "prompt": self.prompts[idx], "question": self.questions[idx], "answer": self.answers[idx]}

    @staticmethod
    def extract_answer(answer_str):
        """The gold number after a GSM8K answer's last '####' (an int or float is taken as it is); else None."""
        if isinstance(answer_str, (int, float)) and not isinstance(answer_str, bool):
            return float(answer_str) if math.isfinite(answer_str) and float(answer_str) == answer_str else None
        if not isinstance(answer_str, str) or "####" not in answer_str:
            return None
        return parse_number(answer_str.rsplit("####", 1)[1])


def collate_prompts(batch: list[dict], tokenizer) -> dict:
    """Items as one batch under their own keys, prompts left-padded (every completion starts at one column)."""
    padded = tokenizer.pad({"input_ids": [b["input_ids"].tolist() for b in batch],
                            "attention_mask": [b["attention_mask"].tolist() for b in batch]},
                           padding_side="left", return_tensors="pt")
    return {**padded, **{key: [b[key] for b in batch] for key in ("prompt", "question", "answer")}}


# ===== Part 2: reward ==============================================================================================

# A number is a whole token: optional signs, digits (thousands separators in groups of three), an optional decimal
# part, then closing punctuation only: "1,234.", "$-5" are numbers, "3/4", "1,2,3", "1e309", "12kg" none; in \boxed{}
# (Qwen2.5's form) the brace ends it. No two neighbouring classes overlap: matching stays linear.
_DIGITS = r"-?\s?(?:\\?\$)?\s?-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER = _DIGITS + r"(?=[.,;:!?%)*}\]]*(?:\s|$))"
_BOXED = r"\\boxed\{[ \t]*(" + _DIGITS + r")[ \t]*\}"
_ANSWER_MARKER = re.compile(r"(?:####|answer is:?)[ \t*]*(" + _NUMBER + ")|" + _BOXED, re.IGNORECASE)
# The final answer: a last line '#### N', or the last \boxed{N} in the last line, then closing delimiters only
# (_FINAL_BOX is matched once, from the last \boxed{, so its overlapping classes stay linear).
_FINAL_LINE = re.compile(r"(?:^|\n)[ \t]*####[ \t]*(" + _NUMBER + r")[\s.]*$")
_FINAL_BOX = re.compile(_BOXED + r"[^\n]{0,100}(?:\s|\\\]|\$)*")
_WHOLE_NUMBER = re.compile(r"\s*(" + _NUMBER + r")[.,;:!?%)*}\]]*\s*")


def parse_number(text: str) -> float | None:
    """The number `text` holds as one whole token (see _NUMBER), or None; overflow to inf, or an integer a float
    cannot hold exactly, is no number."""
    if not isinstance(text, str) or not (m := _WHOLE_NUMBER.fullmatch(text)):
        return None
    digits = re.sub(r"[\s,$\\]", "", m.group(1))
    value = float(digits)      # an integer a float cannot hold exactly (above 2**53) would compare as another one
    return value if math.isfinite(value) and ("." in digits or int(digits) == value) else None


def extract_answer_from_completion(completion):
    """The number after the last answer marker ('####', '\\boxed{', 'answer is') that a number follows; else None."""
    numbers = _ANSWER_MARKER.findall(completion or "")
    return parse_number("".join(numbers[-1])) if numbers else None     # one of its two groups matched


def final_line_answer(completion: str) -> float | None:
    """The number of a well-formed ending ('#### N' or \\boxed{N} closing the completion), or None."""
    text = completion or ""
    match = _FINAL_LINE.search(text) or _FINAL_BOX.fullmatch(text[text.rfind("\\boxed{"):])
    return parse_number(match.group(1)) if match else None


def same_number(pred: float | None, gold: float | None) -> bool:
    """Exact, as the numbers are written; a float's rounding error is forgiven only where the gold is no integer."""
    return pred is not None and gold is not None and (pred == gold or not float(gold).is_integer() and math.isclose(
        pred, gold, rel_tol=1e-9, abs_tol=1e-12))


def compute_reward(completions, ground_truth_answers, *, format_reward=0.0, strict_answer=False):
    """1.0 per completion whose last marked answer ('#### N', '\\boxed{N}', 'answer is N') is the gold, else 0.0; plus
    `format_reward` if well formed (with `strict_answer`, only the well-formed final line's number counts)."""
    golds = ground_truth_answers.tolist() if torch.is_tensor(ground_truth_answers) else list(ground_truth_answers)
    if len(golds) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(golds)} answers")
    finals = [final_line_answer(c) for c in completions]
    return torch.tensor([float(same_number(final if strict_answer else extract_answer_from_completion(c), g))
                         + format_reward * (final is not None) for c, g, final in zip(completions, golds, finals)],
                        dtype=torch.float32)


# ===== Part 3: GRPO algorithm (pure tensor functions) ==============================================================

# ----- TODO 2: group-relative advantages -----
def compute_advantages_grpo(rewards, group_size=4, *, normalize_by_std=True, advantage_eps=1e-4):
    """Rewards laid out group after group -> advantages in the same layout. Default, the GRPO paper's (DeepSeekMath):
    A = (r - mean of its group) / (std of its group + advantage_eps), std with Bessel's correction (torch.std).
    normalize_by_std=False: A = r - mean of its group (Dr. GRPO). A group of equal rewards gets exactly 0."""
    rewards = torch.as_tensor(rewards)        # ints, bools, bf16: computed in float32; float64 stays float64
    grouped = rewards.to(torch.promote_types(rewards.dtype, torch.float32)).reshape(-1, group_size)  # [prompts, G]
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_by_std:
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + advantage_eps)
    no_spread = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)          # the mean may round: force exact 0
    return torch.where(no_spread, 0.0, advantages).reshape(-1)              # [prompts * G]


def masked_mean(tensor, mask):
    """Mean over each row's masked entries, then over rows (the GRPO paper's reduction)."""
    mask = mask.bool()
    return (torch.where(mask, tensor, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)).mean()     # rows [batch], then mean


# ----- TODO 3: the clipped policy-gradient loss -----
def compute_policy_loss(logprobs, old_logprobs, advantages, loss_mask, clip_eps=0.2):
    """PPO's clipped surrogate, averaged over a completion's tokens, then over completions (the GRPO paper's reduction).
    Per token: -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A), ratio = exp(logprobs - old_logprobs), A the
    completion's advantage. Tokens outside loss_mask are left out, even an inf there. The log-ratio is clamped to
    +-20 so exp stays finite in fp32; past the clamp no gradient flows."""
    logratio = torch.where(loss_mask.bool(), logprobs - old_logprobs, 0.0)    # [batch, seq]
    ratio = torch.exp(logratio.clamp(-20.0, 20.0))                            # exp(20) ~ 5e8 keeps fp32 finite
    adv = torch.as_tensor(advantages).to(ratio).reshape(-1, 1)                # [batch, 1]: one per completion
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)   # [batch, seq]
    return masked_mean(per_token, loss_mask)                                  # scalar


# ===== Part 4: training loop: generation, log-probs, the update, train_grpo, evaluation ============================

def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the model's generation_config EOS list plus the tokenizer's EOS."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [*(ids if isinstance(ids, (list, tuple)) else [ids]), tokenizer.eos_token_id]
    return sorted({i for i in ids if i is not None})


def sampling_config(temperature: float, max_new_tokens: int, eos_ids: list[int], pad_id: int):
    """Every knob of the sampling distribution: Qwen2.5's own (top_p 0.8, ...) would differ from softmax(logits/T)."""
    from transformers import GenerationConfig
    knobs = dict(do_sample=False, num_beams=1, repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0)
    if temperature > 0:
        knobs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, min_p=None, typical_p=1.0,
                     epsilon_cutoff=0.0, eta_cutoff=0.0)
    return GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id, use_cache=True,
                            **knobs)


def generate_completions(model, tokenizer, input_ids, attention_mask, max_new_tokens=256, temperature=1.0,
                         num_samples=4, *, batch_size=None, prefill=None):
    """Sample `num_samples` completions per prompt (grouped per prompt; temperature 0: greedy), `batch_size` rows a
    call. Returns output_ids, attention_mask, completion_mask (through the first EOS), prompt_length, completions
    (text), truncated, completion_lengths. `prefill`: a run's KV cache of each prompt, computed once for its group."""
    from transformers import GenerationConfig
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    config = sampling_config(temperature, max_new_tokens, eos_ids, pad_id)
    order = attention_mask.argsort(dim=1, stable=True)     # pads first: generate() mis-positions a right-padded row
    input_ids, attention_mask = input_ids.gather(1, order), attention_mask.gather(1, order)
    prompt_ids = input_ids.repeat_interleave(num_samples, dim=0)             # [rows, prompt]
    prompt_mask = attention_mask.repeat_interleave(num_samples, dim=0)
    (rows, prompt_length), batch_size = prompt_ids.shape, batch_size or len(prompt_ids)
    share_prefill = prefill is not None and num_samples > 1 and batch_size >= num_samples and prompt_length > 1
    batch_size -= batch_size % num_samples if share_prefill else 0
    pieces, models_config, was_training = [], model.generation_config, model.training
    model.generation_config = GenerationConfig(eos_token_id=eos_ids)     # the model's own knobs out of generate()'s way
    model.eval()                  # HF turns the KV cache off in training mode when gradient checkpointing is on
    try:
        with torch.no_grad():
            for start in range(0, rows, batch_size):
                group = slice(start // num_samples, (start + batch_size) // num_samples)
                cache = prefill(model, input_ids[group], attention_mask[group], num_samples) if share_prefill else {}
                out = model.generate(input_ids=prompt_ids[start:start + batch_size], **cache,
                                     attention_mask=prompt_mask[start:start + batch_size], generation_config=config)
                pieces.append(out[:, prompt_length:])
    finally:
        model.generation_config, _ = models_config, model.train(was_training)
    width = max(p.shape[1] for p in pieces)
    new_tokens = torch.cat([F.pad(p, (0, width - p.shape[1]), value=pad_id) for p in pieces])  # [rows, new]
    is_eos = torch.isin(new_tokens, torch.tensor(eos_ids, device=new_tokens.device))
    # Position of the first EOS (width when none): tokens up to and including it are the completion.
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), width)  # [rows]
    completion_mask = torch.arange(width, device=new_tokens.device)[None] <= first_eos[:, None]   # [rows, new]
    completions = [tokenizer.decode(row[: int(n)], skip_special_tokens=True)
                   for row, n in zip(new_tokens.tolist(), first_eos.tolist())]
    return {"output_ids": torch.cat([prompt_ids, new_tokens], dim=1),
            "attention_mask": torch.cat([prompt_mask, torch.ones_like(new_tokens)], dim=1),
            "completion_mask": torch.cat([torch.zeros_like(prompt_ids), completion_mask.long()], dim=1),
            "prompt_length": prompt_length, "completions": completions, "truncated": ~is_eos.any(1),
            "completion_lengths": completion_mask.sum(1)}


@dataclass
class Rollout:
    """One step's samples, carried from generation through reward to the update."""
    output_ids: torch.Tensor        # [rows, seq] prompt + completion
    attention_mask: torch.Tensor    # [rows, seq] exactly what sampling attended to
    loss_mask: torch.Tensor         # [rows, seq] completion tokens that enter the loss
    prompt_length: int
    completions: list[str]
    rewards: torch.Tensor           # [rows]
    advantages: torch.Tensor        # [rows]
    truncated: torch.Tensor         # [rows] bool
    completion_lengths: torch.Tensor  # [rows]
    old_logprobs: torch.Tensor | None = None   # [rows, seq] the sampling policy's, saved by a run before PPO epochs
    ref_logprobs: torch.Tensor | None = None   # [rows, seq] a KL penalty's reference (a run's)

    def old(self, logprobs):      # PPO's old log-probs: old_logprobs if saved, else these detached (fresh samples)
        return logprobs.detach() if self.old_logprobs is None else self.old_logprobs

    @classmethod
    def of(cls, sample: dict, rewards, advantages, cfg: Config, tokenizer=None) -> "Rollout":
        """A sample with its rewards and advantages. From a sampler's three keys alone, a completion ends at its first
        EOS or pad token (cut off: none within cfg.max_new_tokens), and a prompt starts at its first non-pad token."""
        ids, start, pad = sample["output_ids"], sample["prompt_length"], getattr(tokenizer, "pad_token_id", None)
        ends = [t for t in (getattr(tokenizer, "eos_token_id", None), pad) if isinstance(t, int)]
        ended = torch.isin(ids, torch.tensor(ends, dtype=ids.dtype, device=ids.device))    # [rows, seq]: EOS or pad
        ended[:, :start] = False                                         # the prompt's padding ends no completion
        completion = (torch.arange(ids.shape[1], device=ids.device) >= start) & (ended.cumsum(1) - ended.int() == 0)
        truncated = sample.get("truncated", ~ended.any(1) & (ids.shape[1] - start >= cfg.max_new_tokens))    # [rows]
        loss_mask = sample.get("completion_mask", completion).bool() & ~(truncated[:, None] & cfg.mask_truncated)
        attention = sample.get("attention_mask", (ids != pad).cumsum(1) > 0 if isinstance(pad, int) else ids >= 0)
        return cls(ids, attention.long(), loss_mask, start, sample["completions"], rewards, advantages, truncated.cpu(),
                   sample.get("completion_lengths", loss_mask.sum(1)).cpu())


# ----- TODO 4: per-token log-probs of the sampled tokens -----
def compute_logprobs_from_model(model, input_ids, attention_mask, *, temperature=1.0, prompt_length=None):
    """[batch, seq] with entry [b, t] = log p(input_ids[b, t] | input_ids[b, :t]) under softmax(logits / T), the
    distribution the sampler drew from; 0 at column 0 and before prompt_length. A padded row's positions count its
    real tokens only, as generate() counts them (the model's default, the column index, would count padding)."""
    start = min(max(1, prompt_length or 0), input_ids.shape[1])                  # the first column scored
    padded = attention_mask is not None and not bool(attention_mask.all())      # left or right: as generate() counts
    positions = {"position_ids": (attention_mask.long().cumsum(-1) - 1).clamp(min=0)} if padded else {}
    logits = model(input_ids=input_ids, attention_mask=attention_mask, **positions).logits    # [batch, seq, vocab]
    logits = logits[:, start - 1:-1]                           # position t - 1 predicts token t: [batch, seq - start]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature      # bf16 -> fp32; fp64 stays
    logprobs = logits.log_softmax(-1).gather(-1, input_ids[:, start:, None]).squeeze(-1)     # [batch, seq - start]
    return F.pad(logprobs, (start, 0))                                                       # [batch, seq]


def step_line(r: dict) -> str:
    """A step's line: what moves, not the loss (near 0 at ratio 1); a zero (rewards alike?) or NaN gradient: no step."""
    return (f"step {r['step']}: mean reward {r['reward_mean']:.3f}, length {r['completion_len_mean']:.0f} tokens "
            f"({r['truncated_frac']:.0%} cut off at the limit), grad norm {r['grad_norm']:.3g}" + (
                "" if 0 < r["grad_norm"] < math.inf else " (no update)"))


def prompts_and_golds(batch, device):     # a batch's prompts on the device, its gold numbers (float64: exact integers)
    if not isinstance(batch, Mapping):          # a collate_fn that keeps the list of items
        raise TypeError(f"train_loader gave a {type(batch).__name__}, not a batch dict (collate_prompts)")
    return (batch["input_ids"].to(device), batch["attention_mask"].to(device),
            torch.as_tensor(batch["answer"], dtype=torch.float64))


class Hooks:
    """The seam between train_grpo and a run, as the plain loop; UpdateHooks and Run (below the banner) extend it."""
    generation = {}       # generate_completions' options (a run's: its batch size, a prompt's KV cache once a group)

    def __init__(self):
        self.history = []

    def batches(self, loader, num_epochs: int, device):     # each batch's (prompts, mask, golds); a run resumes
        return (prompts_and_golds(batch, device) for _ in range(num_epochs) for batch in loader)

    def updates(self, rollout: Rollout):        # the rollouts to update on: this one, once (a run: its PPO epochs)
        return [rollout]

    def micro_batches(self, rollout: Rollout):  # (rows, their share of the loss): all at once (a run: a few at a time)
        return [(rollout, 1.0)]

    def penalized(self, micro: Rollout, logprobs, loss):        # a micro-batch's loss (a run adds its KL penalty)
        return loss

    def record(self, rollout: Rollout, grad_norm: float):    # after an update: the step's record and printed line
        self.history.append({"step": len(self.history) + 1, "reward_mean": rollout.rewards.mean().item(),
                             "completion_len_mean": rollout.completion_lengths.float().mean().item(),
                             "truncated_frac": rollout.truncated.float().mean().item(), "grad_norm": grad_norm})
        print(step_line(self.history[-1]))


def checked_config(cfg: Config | None, hooks: Hooks | None, num_epochs, group_size, clip_eps, max_new_tokens) -> Config:
    """Config's defaults with the template's arguments, or `cfg` if they agree; a run's config only with its hooks."""
    given = {"num_epochs": num_epochs, "group_size": group_size, "clip_eps": clip_eps, "max_new_tokens": max_new_tokens}
    if clash := [f"{name}={value} (cfg.{name} = {getattr(cfg, name)})" for name, value in given.items()
                 if cfg is not None and getattr(cfg, name) != value]:
        raise ValueError(f"train_grpo: {', '.join(clash)}: pass cfg's values, or leave cfg out")
    if hooks is None and cfg is not None and type(cfg) is not Config:
        raise ValueError(f"train_grpo: a {type(cfg).__name__} holds settings only a run's hooks honour (PPO epochs, "
                         f"KL penalty, step limit, signal filling): pass hooks=UpdateHooks(...) or a plain Config")
    return cfg or Config(**given)


def clipped_step(optimizer, max_grad_norm: float) -> float:
    """Clip the gradient of every weight the optimizer holds to max_grad_norm, then step; the norm before clipping."""
    norm = clip_grad_norm_([w for group in optimizer.param_groups for w in group["params"]], max_grad_norm).item()
    if 0 < norm < math.inf:        # no step on a zero gradient (AdamW would still move the weights), NaN or inf
        optimizer.step()
    return norm


# ----- TODO 5: the GRPO training loop -----
def train_grpo(model, tokenizer, train_loader, optimizer, device, num_epochs=1, group_size=4, clip_eps=0.2,
               max_new_tokens=256, *, cfg: Config | None = None, hooks: Hooks | None = None):
    """For each batch: (1) sample group_size completions per prompt, (2) reward them, (3) compare each reward with its
    group's (the advantages), (4) one optimizer step on TODO 3's loss (fresh samples: ratio 1, the clip never binds;
    no step on a zero or non-finite gradient). Returns the step records; cfg: Config with the arguments above."""
    cfg, hooks = checked_config(cfg, hooks, num_epochs, group_size, clip_eps, max_new_tokens), hooks or Hooks()
    for input_ids, attention_mask, answers in hooks.batches(train_loader, num_epochs, device):
        # 1. Sample group_size completions of each prompt from the current policy
        sample = generate_completions(model, tokenizer, input_ids, attention_mask, max_new_tokens, cfg.temperature,
                                      group_size, **hooks.generation)
        # 2. Reward: 1 if the number after a completion's last answer marker is its problem's gold (repeated G times)
        rewards = compute_reward(sample["completions"], answers.repeat_interleave(group_size), **cfg.reward_options)
        # 3. Advantages: each reward against its group's mean (and std)
        advantages = compute_advantages_grpo(rewards, group_size, **cfg.advantage_options)
        # 4. The update: log-probs, clipped loss and backward pass (in a run micro-batch by micro-batch), one step
        for rollout in hooks.updates(Rollout.of(sample, rewards, advantages, cfg, tokenizer)):
            optimizer.zero_grad()
            for micro, share in hooks.micro_batches(rollout):        # the shares' gradients add up to the batch's
                logprobs = compute_logprobs_from_model(model, micro.output_ids, micro.attention_mask,
                                                       temperature=cfg.temperature, prompt_length=micro.prompt_length)
                # old log-probs: these, detached (fresh samples: ratio 1), unless a run saved them for its PPO epochs
                loss = compute_policy_loss(logprobs, micro.old(logprobs), micro.advantages, micro.loss_mask, clip_eps)
                (share * hooks.penalized(micro, logprobs, loss)).backward()
            hooks.record(rollout, grad_norm=clipped_step(optimizer, cfg.max_grad_norm))   # the step, then its record
    return hooks.history


def evaluate(model, tokenizer, dataset: GSM8KDataset, cfg: Config, device, desc="eval") -> tuple[dict, list[dict]]:
    """Greedy accuracy (same extraction as the reward) and format compliance; one record per problem."""
    from tqdm.auto import tqdm
    loader = DataLoader(dataset, cfg.eval_batch_size, generator=torch.Generator(),     # its own: the global one's
                        collate_fn=lambda b: collate_prompts(b, tokenizer))            # draws would shift sampling
    records = []
    for batch in tqdm(loader, desc=desc, dynamic_ncols=True, disable=None):     # None: no bar in a log file
        out = generate_completions(model, tokenizer, batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                   cfg.max_new_tokens, temperature=0.0, num_samples=1, batch_size=cfg.eval_batch_size)
        for question, gold, completion, tokens, cut in zip(batch["question"], batch["answer"], out["completions"],
                                                           out["completion_lengths"].tolist(), out["truncated"]):
            records.append({"question": question, "gold": gold, "completion": completion, "tokens": tokens,
                            "truncated": bool(cut), "extracted": extract_answer_from_completion(completion),
                            "correct": same_number(extract_answer_from_completion(completion), gold),
                            "well_formed": final_line_answer(completion) is not None})
    n = max(len(records), 1)
    return ({"accuracy": sum(r["correct"] for r in records) / n,
             "format_rate": sum(r["well_formed"] for r in records) / n}, records)


# ===== Part 5: main ================================================================================================

def main(argv: list[str] | None = None) -> int:
    """`python grpo_homework.py MODEL_PATH [flags]` or --demo/--resume/--report; any failure: one line, exit 2."""
    with ctrl_c_latch():            # Ctrl-C, SIGTERM, SIGHUP: the first one stops training after its step
        try:
            run_command(*parse_config(argv))     # the homework run: load, evaluate, train_grpo, evaluate, save
        except (UserError, KeyboardInterrupt) as e:     # Ctrl-C here: before a run began (parsing), nothing written
            print(f"error: {str(e) or 'interrupted before the run began; nothing was written'}", file=sys.stderr)
            return 2
    return 0


# ---------------------------------------------------------------------------------------------------------------
# WHAT SUPPORTS THE RUN. The homework ends above. Below: what a real run needs around it (command line, set-up, run
# folder and resume, records, plots, devices, tasks, demo) and its options on top of the step (Dr. GRPO's reduction,
# KL penalty, PPO epochs, a step filled with signal: Run, the Hooks train_grpo is given). Parts 1-4 use nothing below.
# ---------------------------------------------------------------------------------------------------------------

import argparse
import contextlib
import copy
import dataclasses
import gc
import hashlib
import importlib.metadata
import itertools
import json
import random
import shutil
import time
import warnings


# ----- The run's settings, command line and validation -----

@dataclass
class RunConfig(Config):
    """Config and what a run around the loop reads; every field is a flag (build_arg_parser), after Config's."""
    # data
    task: str = _flag("gsm8k", "gsm8k, or generated word problems", choices=["gsm8k", "arithmetic"])
    train_size: int = _flag(0, "training problems taken from the train split (0 = all)")
    eval_size: int = _flag(0, "test problems scored greedily before and after training (0 = all 1,319)")
    eval_start: int = _flag(0, "position of the first evaluation problem in its split")
    val_size: int = _flag(0, "the first N train problems, held out (never trained on) to choose settings on")
    eval_split: str = _flag("test", "what the accuracy before and after scores", choices=["test", "validation"])
    prompt_style: str = _flag("chat", "chat: the tokenizer's template; plain: the handout's", choices=["chat", "plain"])
    max_prompt_length: int = _flag(512, "prompts longer than this many tokens are dropped, with a warning")
    # a step filled with signal (DAPO's dynamic sampling)
    min_signal_groups: int = _flag(-1, "draw batches until N groups' rewards differ (-1: --batch-size, 0: off)")
    max_draws: int = _flag(4, "at most this many further batches a step draws for --min-signal-groups")
    # optimization
    max_steps: int = _flag(200, "stop after this many steps (0 = no limit)")
    kl_coef: float = _flag(0.0, "weight of the k3 KL to the starting model (0 = no reference)")
    ppo_epochs: int = _flag(1, "updates on each rollout; >1 computes old log-probs once before the first")
    loss_agg: str = _flag("seq-mean", "seq-mean: TODO 3's mean per answer, then over answers (GRPO); drgrpo: sum / "
                          "(answers x max-new-tokens), as TODO 3 with each advantage x its length / max-new-tokens "
                          "(Dr. GRPO)", choices=["seq-mean", "drgrpo"])
    generation_batch_size: int = _flag(64, "sequences per generate call (halved automatically on CUDA OOM)")
    micro_batch_size: int = _flag(4, "sequences per forward/backward in the update (gradients accumulate exactly)")
    lora_rank: int = _flag(0, "train peft LoRA adapters of this rank instead of every weight (0 = full)")
    lora_alpha: int = _flag(32, "LoRA scale: an adapter's update is multiplied by alpha / rank")
    lora_targets: str = _flag("all-linear", "layers with adapters: all-linear (the body's), or names: q_proj,v_proj")
    lr_warmup_steps: int = _flag(10, "linear learning-rate warm-up, then constant")
    lr_decay: bool = _flag(False, "after the warm-up, decay linearly to 0 at the last step (--max-steps or data end)")
    weight_decay: float = _flag(0.0, "AdamW decoupled weight decay")
    gradient_checkpointing: str = _flag("auto", "recompute activations (auto: on CUDA)", choices=["auto", "on", "off"])
    compile_generation: str = _flag("auto", "generate with a static KV cache compiled by torch.compile (auto: on CUDA)",
                                    choices=["auto", "on", "off"])
    dtype: str = _flag("auto", "weights (auto: bf16 where native)", choices=["auto", "bfloat16", "float32"])
    # run
    seed: int = _flag(0, "seed for data order, sampling and the demo")
    device: str = _flag("auto", "auto = cuda when available, else cpu (with a warning)")
    output_dir: str = _flag("runs/grpo", "where metrics, plots, checkpoints and final/ are written")
    save_every: int = _flag(0, "checkpoint every N steps (0 = only on interrupt)")
    keep_checkpoints: int = _flag(0, "keep only the newest N checkpoints, deleting older ones (0 = keep all)")
    plot_every: int = _flag(10, "redraw plots every N steps")
    show_examples: int = _flag(5, "problems printed with their answers before and after")
    eval_only: bool = _flag(False, "score MODEL_PATH greedily into eval.jsonl and stop; nothing trains")
    signal_groups = property(lambda c: c.batch_size if c.min_signal_groups == -1 else c.min_signal_groups)  # not a flag


def flag_name(field_name: str) -> str:
    return "MODEL_PATH" if field_name == "model_path" else "--" + field_name.replace("_", "-")


def build_arg_parser(defaults: bool = True) -> argparse.ArgumentParser:
    """The CLI, one flag per Config field; defaults=False leaves out every field's default (to see what was typed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    def refuse(message: str):      # one line and exit status 2, as any bad input gets (not 45 lines of usage first)
        raise UserError(f"{message} (--help lists every flag)")
    parser.error = refuse
    for f in dataclasses.fields(RunConfig):
        kwargs = {**f.metadata, "default": f.default if defaults else argparse.SUPPRESS}
        if f.name == "model_path":
            parser.add_argument("model_path", nargs="?", **kwargs)
        elif isinstance(f.default, bool):
            parser.add_argument(flag_name(f.name), action=argparse.BooleanOptionalAction, **kwargs)
        else:
            parser.add_argument(flag_name(f.name), type=type(f.default), **kwargs)
    parser.add_argument("--demo", action="store_true", help="build a tiny model and task and run GRPO on CPU")
    parser.add_argument("--report", metavar="RUN_DIR", help="redraw a run's plots and report_draft.md, then exit")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its last checkpoint")
    return parser


class UserError(Exception):
    """Bad input: main prints the message as one line and exits with status 2."""


def require(ok, message: str) -> None:
    if not ok:
        raise UserError(message)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def validate_config(cfg: RunConfig) -> None:
    """Raise UserError naming the first flag whose value cannot train as intended."""
    for f in dataclasses.fields(RunConfig):     # nan and inf pass every comparison below, or fail it silently
        value = getattr(cfg, f.name)
        if isinstance(f.default, float):      # the run computes in float32: 1e300 would be inf there
            require(math.isfinite(value) and abs(value) <= torch.finfo(torch.float32).max,
                    f"{flag_name(f.name)} must be a finite number (in float32: at most 3.4e38)")
        elif type(f.default) is int:
            require(abs(value) < 2**63, f"{flag_name(f.name)} is too large (at most 2**63 - 1)")
        if "choices" in f.metadata:         # argparse checks the command line; this checks a saved config too
            require(value in f.metadata["choices"], f"{flag_name(f.name)} must be one of "
                                                    f"{', '.join(f.metadata['choices'])} (not {value!r})")
    require(cfg.group_size >= 2, "--group-size must be at least 2 (advantages compare samples of one prompt)")
    require(cfg.temperature >= 1e-3, "--temperature must be at least 0.001 (sampling and log-probs divide by it)")
    for name in ("batch_size", "micro_batch_size", "generation_batch_size", "eval_batch_size", "num_epochs",
                 "ppo_epochs", "max_new_tokens", "max_prompt_length", "learning_rate", "max_grad_norm"):
        require(getattr(cfg, name) > 0, f"{flag_name(name)} must be positive")
    for name in ("train_size eval_size eval_start val_size lora_rank max_steps save_every keep_checkpoints plot_every "
                 "max_draws show_examples lr_warmup_steps advantage_eps kl_coef format_reward weight_decay").split():
        require(getattr(cfg, name) >= 0, f"{flag_name(name)} must not be negative")
    require(cfg.min_signal_groups >= -1, "--min-signal-groups must be a count of groups, 0 (off) or -1 (--batch-size)")
    require(cfg.generation_batch_size % cfg.group_size == 0,
            "--generation-batch-size must be a multiple of --group-size (a group is sampled together)")
    require(0 < cfg.clip_eps < 1, "--clip-eps must lie in (0, 1)")
    require(not cfg.lr_decay or cfg.max_steps > cfg.lr_warmup_steps, "--lr-decay (on in --demo) needs --max-steps "
            "above --lr-warmup-steps (the decay ends at --max-steps); --no-lr-decay turns it off")
    if cfg.lora_rank:
        import importlib.util
        require(importlib.util.find_spec("peft"), "--lora-rank needs peft, which is not installed: pip install peft")
        require(cfg.lora_alpha > 0 and cfg.lora_targets.strip(", ") != "", "--lora-alpha must be positive and "
                                                                            "--lora-targets name layers")
    require(cfg.learning_rate * cfg.weight_decay < 1, "--weight-decay times --learning-rate must stay below 1")
    require(0 <= cfg.seed < 2**32, "--seed must lie in [0, 2**32)")
    require(cfg.eval_split == "test" or cfg.eval_start + max(cfg.eval_size, 1) <= cfg.val_size,
            "--eval-split validation scores the --val-size held-out problems: pass --val-size N, at least --eval-start "
            "+ --eval-size")
    require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device), f"--device must be auto, cpu, cuda or cuda:N: this "
                                                              f"script trains on cpu or cuda only (not {cfg.device!r})")
    require_gpu(cfg.device)          # here, not only when the model loads: the demo warms up first (minutes)
    require(cfg.output_dir.strip() != "", "--output-dir must name a folder (it is empty)")
    require(cfg.output_dir.encode(errors="ignore").decode() == cfg.output_dir,     # tokenizers needs UTF-8 names
            "--output-dir must be a UTF-8 path (the tokenizer's files are written by name)")
    out = os.path.abspath(os.path.expanduser(cfg.output_dir)).encode()      # checkpoints add ~80 characters
    require(len(out) < 3900 and max(map(len, out.split(b"/"))) < 200, "--output-dir is too long for a run's files")
    require(cfg.task != "gsm8k" or cfg.dataset.strip() != "", "--task gsm8k has no generated problems: pass --dataset "
                                                              "(GSM8K in hub layout, or a hub id)")


# What --eval-only reads (greedy: no --seed; no examples printed); every other flag is refused there.
EVAL_ONLY_FLAGS = {"model_path", "eval_only", "task", "dataset", "eval_size", "eval_start", "val_size", "eval_split",
                   "prompt_style", "max_prompt_length", "max_new_tokens", "eval_batch_size", "device", "dtype",
                   "output_dir", "compile_generation"}
# Flags a resumed run may change: how it runs, not what it learns (else one record would describe two trainings).
RESUME_MAY_CHANGE = {"max_steps", "num_epochs", "save_every", "keep_checkpoints", "plot_every", "show_examples",
                     "device", "generation_batch_size", "micro_batch_size", "eval_batch_size", "gradient_checkpointing",
                     "compile_generation"}


def saved_config(run_dir: Path) -> RunConfig:
    """The Config a run folder recorded, checked field by field (it may be damaged or from another version)."""
    recorded = recorded_config(run_dir)         # unreadable JSON: 'damaged?' in one line
    require(is_run_dir(run_dir), f"--resume {run_dir}: no run record (config.json) there, so it is not a run directory")
    if unknown := sorted(set(recorded) - set(RunConfig.__dataclass_fields__)):
        raise UserError(f"{run_dir / 'config.json'}: unknown setting(s) {', '.join(unknown)} (another version?)")
    for f in dataclasses.fields(RunConfig):
        value = recorded.get(f.name, f.default)
        if not (type(value) is type(f.default) or (type(f.default) is float and type(value) is int)):
            raise UserError(f"{run_dir / 'config.json'}: {f.name} = {value!r} is not a {type(f.default).__name__}")
    return RunConfig(**recorded)


def parse_config(argv: list[str] | None) -> tuple[RunConfig, argparse.Namespace]:
    """RunConfig from the command line; with --demo or --resume, flags given explicitly override their base."""
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):      # N copies would race for one run folder
        raise UserError("this script trains in one process on one GPU: run it with python, not torchrun")
    args, typed = build_arg_parser().parse_args(argv), vars(build_arg_parser(defaults=False).parse_args(argv))
    explicit = {k: v for k, v in typed.items() if k in RunConfig.__dataclass_fields__}
    for key in {"model_path", "dataset", "output_dir"} & set(explicit):   # a shell leaves ~ after '=' or in quotes
        explicit[key] = os.path.expanduser(explicit[key]) if key == "output_dir" else absolute_if_local(explicit[key])
    if "" in (args.resume, args.report):            # '' is an unset shell variable, not "no --resume"
        raise UserError(f"--{'resume' if args.resume == '' else 'report'} needs a RUN_DIR (it is empty)")
    args.resume, args.report = (os.path.expanduser(p) if p else p for p in (args.resume, args.report))
    if len(modes := [name for name in ("demo", "resume", "report") if getattr(args, name)]) > 1:
        raise UserError(f"--{modes[0]} and --{modes[1]} cannot be combined")
    if args.report and explicit:
        raise UserError(f"--report only redraws a run's plots: it takes no other flags (got {', '.join(explicit)})")
    if args.demo and (given := [flag_name(k) for k in ("model_path", "task", "dataset", "eval_only") if k in explicit]):
        raise UserError(f"--demo builds its own model, then trains and scores it on addition problems it generates: "
                        f"leave out {' and '.join(given)}")
    if args.resume:
        base = saved_config(Path(args.resume))
        if explicit.get("dtype") == "auto":          # recorded as it resolved: auto keeps it
            del explicit["dtype"]
        if "output_dir" in explicit and Path(explicit["output_dir"]).resolve() != Path(args.resume).resolve():
            raise UserError(f"--resume continues the run in {args.resume}: leave out --output-dir")
        # A --lr-decay run's learning rate was already decayed towards its old last step, which must stay
        may_change = (RESUME_MAY_CHANGE | {"output_dir"}) - ({"max_steps", "num_epochs"} if base.lr_decay else set())
        if base.eval_only and (idle := sorted(set(explicit) - EVAL_ONLY_FLAGS)):
            raise UserError(f"{', '.join(map(flag_name, idle))} would do nothing: {args.resume} is an --eval-only "
                            f"run, which trains nothing")
        if (size := explicit.get("generation_batch_size", base.generation_batch_size)) != base.generation_batch_size:
            warn(f"--generation-batch-size {base.generation_batch_size} -> {size}: the samples from here on differ "
                 f"from those the run would have drawn (the training stays correct, not bit-identical to an "
                 f"uninterrupted run)")
        if changed := sorted(k for k, v in explicit.items() if k not in may_change and v != getattr(base, k)):
            raise UserError(f"--resume cannot change {', '.join(map(flag_name, changed))}: "
                            f"the run was started with other values (start a new run instead)")
        return dataclasses.replace(base, **{**explicit, "output_dir": args.resume}), args
    base = demo_grpo_config(RunConfig()) if args.demo else RunConfig()
    if explicit.get("task", base.task) != "gsm8k" and "dataset" not in explicit:
        explicit["dataset"] = ""          # ./gsm8k would silently train another task on GSM8K's questions
    cfg = dataclasses.replace(base, **{"dataset": absolute_if_local(base.dataset), **explicit})
    if cfg.eval_only and (unused := sorted(set(explicit) - EVAL_ONLY_FLAGS)):
        raise UserError(f"{', '.join(map(flag_name, unused))} would do nothing with --eval-only, which trains nothing")
    idle = {("val_size",): cfg.eval_only and cfg.eval_split == "test" and
            "with --eval-only on the test split (it holds out train problems for --eval-split validation)",
            ("lora_alpha", "lora_targets"): not cfg.lora_rank and "without --lora-rank (full fine-tuning)",
            ("clip_eps",): cfg.ppo_epochs == 1 and "with one PPO epoch, where every ratio is 1 (the clip acts from "
                                                  "--ppo-epochs 2 on)",
            ("advantage_eps",): cfg.advantage == "drgrpo" and "with --advantage drgrpo (no division by the std)",
            ("max_draws",): cfg.signal_groups == 0 and "with --min-signal-groups 0 (a step per batch)"}
    for unused, why in idle.items():      # a flag that changes nothing would be recorded as if it had
        if why and (given := [flag_name(name) for name in unused if name in explicit]):
            raise UserError(f"{', '.join(given)} would do nothing {why}")
    return cfg, args


def looks_local(path: str) -> bool:
    """A path on this machine, not a hub id ('openai/gsm8k', no such folder here)."""
    return path.startswith((".", "/", "~")) or Path(path).exists()


def absolute_if_local(path: str) -> str:
    """A local path made absolute, so that a resume started from another folder reads the same files."""
    return os.path.abspath(os.path.expanduser(path)) if path and looks_local(path) else path


# Ctrl-C, SIGTERM, SIGHUP alike: while training, the first asks for a stop after the step in flight (checkpointed);
# a second, or any elsewhere, raises KeyboardInterrupt (run_phases: one line). Python drops one raised in a
# finalizer, so a press is latched too (check_ctrl_c raises it again); finalizers failing after it are quiet.
_ctrl_c = {"pressed": False, "training": False, "asked": 0.0}
CTRL_C_REPEAT = 0.2           # seconds: a signal sooner after the first is the same press, forwarded twice


def on_ctrl_c(signum, frame):
    if _ctrl_c["training"] and not (_ctrl_c["asked"] and time.monotonic() - _ctrl_c["asked"] > CTRL_C_REPEAT):
        if not _ctrl_c["asked"]:        # a launcher forwarding one press twice sends both within milliseconds
            _ctrl_c["asked"] = time.monotonic()
            with contextlib.suppress(OSError):        # SIGHUP: the terminal may be gone
                print(f"\n{signal.Signals(signum).name}: stopping after this step (Ctrl-C again, "
                      f"{CTRL_C_REPEAT:g} s or more later, aborts at once)", file=sys.stderr)
        return
    _ctrl_c["pressed"] = True
    raise KeyboardInterrupt


def check_ctrl_c() -> None:
    if _ctrl_c["pressed"]:
        raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_latch():
    """Latch Ctrl-C while the block runs; quiet about one Python dropped (raised again) and finalizers after it."""
    _ctrl_c.update(pressed=False, training=False, asked=0.0)
    signals = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]
    handlers, hook = [signal.signal(s, on_ctrl_c) for s in signals], sys.unraisablehook
    sys.unraisablehook = lambda u: None if _ctrl_c["pressed"] else hook(u)
    try:
        yield
    finally:
        if _ctrl_c["pressed"]:
            gc.collect()        # run what the interrupt left behind while the quiet hook is still in place
        for s, handler in zip(signals, handlers):
            signal.signal(s, handler)
        sys.unraisablehook = hook
        _ctrl_c.update(pressed=False, training=False, asked=0.0)


# ----- The run's phases and set-up, as main (Part 5) calls them: device, model, data, schedule; its failures -----

def run_command(cfg: RunConfig, args: argparse.Namespace) -> None:
    """--report, --demo, or a run (new, resumed or --eval-only) in its claimed folder."""
    if args.report:
        return redraw_report(Path(args.report))
    if args.demo:
        return run_demo(cfg)
    validate_config(cfg)
    with claimed_run_dir(Path(cfg.output_dir), resume=bool(args.resume), model_path=cfg.model_path) as run_dir:
        run_phases(cfg, run_dir, resume=bool(args.resume))


def run_phases(cfg: "RunConfig", run_dir: Path, resume: bool) -> dict:
    """The template's main in phases: set up; evaluate; train (Run.train: train_grpo, the run as hooks); evaluate.
    Each leaves a folder --resume continues from: Ctrl-C or a failure anywhere ends in one line saying how."""
    phase = "loading"
    try:
        run = prepare_run(cfg, run_dir, resume)     # prints Loading tokenizer and model..., dataset..., optimizer...
        for phase, do in ((("the evaluation", score_only),) if cfg.eval_only else
                          (("the evaluation before training", evaluate_before), ("training", Run.train),
                           ("the final evaluation and save", finish_run))):
            do(run)
        return run.summary
    except (KeyboardInterrupt, Exception) as e:      # a full disk in safetensors, NaN sampling, ...: one line
        raise e if isinstance(e, UserError) else failure_message(e, phase, cfg, run_dir, resume) from None


def prepare_run(cfg: RunConfig, run_dir: Path, resume: bool) -> "Run":
    """The template's set-up: model, data, optimizer; a resumed run then continues from its newest checkpoint."""
    device = pick_device(cfg.device)
    as_saved = False          # --eval-only scores a float32 folder (LoRA's merged final/) as trained: bf16 moves it
    if cfg.dtype == "auto":   # recorded as it resolves, so a resume keeps it; a record's auto predates bf16 on CPUs
        with contextlib.suppress(OSError, ValueError, AttributeError):     # transformers 5: dtype; 4: torch_dtype
            saved = json.loads(read_text(Path(cfg.model_path) / "config.json")) if cfg.eval_only else {}
            as_saved = (saved.get("dtype") or saved.get("torch_dtype")) == "float32"
        cfg.dtype = "float32" if (resume and device.type == "cpu") or as_saved else \
            str(weight_dtype("auto", device)).removeprefix("torch.")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)      # the sampling streams; data order is seeded apart (the loader's sampler)
    checkpoint = (saved_checkpoints(run_dir) or [None])[-1] if resume else None     # the newest

    print("Loading tokenizer and model...")
    # LoRA: the starting model with adapters (a checkpoint holds them only); else the checkpoint's weights
    model, tokenizer = load_model_and_tokenizer(str(checkpoint if checkpoint and not cfg.lora_rank else
                                                    cfg.model_path), device, cfg.dtype)
    if cfg.prompt_style == "chat" and not getattr(tokenizer, "chat_template", None):  # plain would mislabel the run
        raise UserError("the tokenizer has no chat template: pass --prompt-style plain")
    model = with_lora(model, cfg, checkpoint) if cfg.lora_rank else model
    # The KL penalty's reference, the starting model: under LoRA the model itself with its adapters off, else a copy
    ref_model = None if cfg.kl_coef <= 0 else model if cfg.lora_rank else \
        load_model_and_tokenizer(cfg.model_path, device, cfg.dtype)[0].requires_grad_(False)
    if cfg.gradient_checkpointing == "on" or (cfg.gradient_checkpointing == "auto" and device.type == "cuda"):
        enable_checkpointing(model)
    if cfg.compile_generation == "on" or (cfg.compile_generation == "auto" and device.type == "cuda"):
        model.generate = CompiledGeneration(model, lambda: (cfg.generation_batch_size, cfg.eval_batch_size),
                                            everywhere=device.type != "cuda")
    model.config.use_cache = False  # the update's forward passes keep no KV cache; generate() asks for its own
    check_kv_cache_fits(cfg, model, device)

    print("Loading dataset...")   # validation: the first --val-size problems of the train split; training, those after
    problems = lambda split, start, end: without_long_prompts(TaskDataset(
        f"{split}[{start or ''}:{end or ''}]" if start or end else split, tokenizer, cfg.max_prompt_length,
        dataset_path=cfg.dataset, prompt_style=cfg.prompt_style, task=TASKS[cfg.task]))
    eval_end = cfg.eval_size and cfg.eval_start + cfg.eval_size
    eval_set = problems("test", cfg.eval_start, eval_end) if cfg.eval_split == "test" else \
        problems("train", cfg.eval_start, eval_end or cfg.val_size)
    require(len(eval_set) > 0, f"no {cfg.eval_split} problems left to evaluate on (all longer than --max-prompt-length "
            f"{cfg.max_prompt_length}, or none given)")
    if cfg.eval_only:                   # nothing trains: no training problems, no optimizer
        return open_record(Run(cfg, None, run_dir=run_dir, device=device, model=model, tokenizer=tokenizer,
                               loader=None, eval_set=eval_set), None, resume)
    train_set = problems("train", cfg.val_size, cfg.train_size and cfg.val_size + cfg.train_size)
    require((n := len(train_set)) >= cfg.batch_size, f"{n} train problems, fewer than --batch-size {cfg.batch_size}")
    # A shuffle that depends only on (seed, epoch): a resumed run sees the same data; the loader's own generator
    # keeps it off the sampling stream, which a resumed run must continue exactly.
    sampler = torch.utils.data.DistributedSampler(train_set, 1, 0, seed=cfg.seed, drop_last=True)
    loader = DataLoader(train_set, cfg.batch_size, sampler=sampler, drop_last=True, generator=torch.Generator(),
                        collate_fn=lambda b: collate_prompts(b, tokenizer))

    print("Setting up optimizer...")
    if not (trained := [p for p in model.parameters() if p.requires_grad]):      # AdamW: "empty parameter list"
        raise UserError(f"MODEL_PATH {cfg.model_path}: no weight of the model would train" + (
            " (it holds adapter_config.json, so transformers loads it as a LoRA adapter on a frozen base: merge the "
            "adapter into the weights, or remove adapter_config.json)"
            if (Path(cfg.model_path) / "adapter_config.json").exists() else ""))
    optimizer = build_optimizer(trained, cfg.learning_rate, cfg.seed, cfg.weight_decay)
    decay_end = last_step(cfg, loader) if cfg.lr_decay else 0    # --max-steps, or sooner the data's end
    require(not cfg.lr_decay or decay_end > cfg.lr_warmup_steps, f"--lr-decay: the run ends after {decay_end} steps, "
            f"within --lr-warmup-steps {cfg.lr_warmup_steps}: lower the warm-up or train for longer")
    if cfg.lr_decay and cfg.signal_groups and cfg.num_epochs * len(loader) < cfg.max_steps * (1 + cfg.max_draws):
        raise UserError(f"--lr-decay: a step draws 1 to {1 + cfg.max_draws} batches, so the data may end before "
                        f"--max-steps {cfg.max_steps}, the rate above 0: lower it or --max-draws, or add --num-epochs")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, cfg.lr_warmup_steps, decay_end))
    return open_record(Run(cfg, optimizer, ref_model, run_dir=run_dir, device=device, model=model, tokenizer=tokenizer,
                           loader=loader, eval_set=eval_set, scheduler=scheduler), checkpoint, resume)


def without_long_prompts(dataset: GSM8KDataset) -> GSM8KDataset:
    """The dataset less its prompts over max_length tokens (cut, a question is another one), so steps are full."""
    encoded = dataset.tokenizer(dataset.prompts, add_special_tokens=dataset.prompt_style != "chat")["input_ids"]
    keep = [i for i, ids in enumerate(encoded) if len(ids) <= dataset.max_length]
    if len(keep) < len(encoded):
        warn(f"dropped {len(encoded) - len(keep)} of {len(encoded)} prompts longer than {dataset.max_length} tokens "
             f"(raise --max-prompt-length to keep them)")
    for name in ("prompts", "questions", "answers", "rows"):
        setattr(dataset, name, [getattr(dataset, name)[i] for i in keep])
    return dataset


def failure_message(error: BaseException, phase: str, cfg: RunConfig, run_dir: Path, resume: bool) -> UserError:
    """A failure or Ctrl-C in a phase, as the one line main prints: how to resume, or why nothing was kept."""
    cause = "interrupted" if isinstance(error, KeyboardInterrupt) else f"failed ({first_line(error)})"
    again = isinstance(error, (KeyboardInterrupt, OSError))    # worth repeating; any other failure would recur
    if phase == "loading" and not (run_dir / "config.json").exists():
        return UserError(f"{cause} while loading; nothing was kept{', so run the same command again' if again else ''}")
    if phase == "training" and "probability tensor contains" in str(error):      # torch.multinomial on NaN or inf
        return UserError(f"the policy diverged during training (its next-token probabilities hold NaN or inf), and "
                         f"a resume would fail the same way: start a new run with a lower --learning-rate (now "
                         f"{cfg.learning_rate:g})")
    if phase == "loading" and resume and not again:
        return UserError(f"{cause} while loading {run_dir} to resume it; the run is as it was")
    newest = f" (from checkpoints/{checkpoints[-1].name})" if isinstance(error, OutOfMemory) and \
        (checkpoints := saved_checkpoints(run_dir)) else ""
    return UserError(f"{cause} during {phase}; resume with: python {Path(sys.argv[0]).name} --resume {run_dir}"
                     f"{getattr(error, 'resume_flags', '')}{newest}")


def lr_multiplier(step: int, warmup_steps: int, decay_end: int = 0) -> float:
    """The learning rate's factor at step `step` (from 0): a linear warm-up, then 1 or a line to 0 at `decay_end`."""
    return (step + 1) / warmup_steps if step < warmup_steps else (
        max(0.0, (decay_end - step) / (decay_end - warmup_steps)) if decay_end else 1.0)


def last_step(cfg: RunConfig, loader) -> int:
    """The step training ends at: --max-steps, or sooner when --num-epochs passes over the data end first."""
    return min(cfg.max_steps or math.inf, cfg.num_epochs * len(loader))


def load_model_and_tokenizer(path: str, device: torch.device, dtype_name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    require(path, "MODEL_PATH is required (a model directory such as ./Qwen2.5-1.5B-Instruct), or use --demo")
    local = Path(path)
    if looks_local(path):
        require(not is_run_dir(local), f"MODEL_PATH {path} is a run folder: its trained model is {local / 'final'} "
                f"(continue the run itself with --resume {path})")
        require((local / "config.json").is_file(), f"MODEL_PATH {path} is not a model directory (no config.json)")
        if not any((local / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
            raise UserError(f"MODEL_PATH {path} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=weight_dtype(dtype_name, device)).to(device)
    except Exception as e:       # a damaged or foreign file surfaces as any of a dozen types; all mean the same
        raise UserError(f"cannot load model from {path}: {first_line(e)}") from None
    # tokenizer_config.json alone loads as a few special tokens: every completion would decode empty and score 0
    require(len(tokenizer) >= (vocab := model.get_input_embeddings().num_embeddings) // 2, f"MODEL_PATH {path}: its "
            f"tokenizer has {len(tokenizer)} tokens for the model's {vocab} (is tokenizer.json missing?)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    with torch.no_grad():    # NaN or inf from the start: neither scoring nor training could mean anything
        probe = model(input_ids=torch.tensor([tokenizer("Question: 1 + 1 = ?")["input_ids"] or [0]], device=device))
    require(torch.isfinite(probe.logits).all(), f"MODEL_PATH {path}: the model's logits hold NaN or inf on a short "
            f"prompt before any training (damaged weights, or an overflow in --dtype {dtype_name}): nothing was scored")
    contiguous_lm_head_input(model)      # the KL reference too, which never generates
    return model, tokenizer


def build_optimizer(params, lr, seed=0, weight_decay=0.0):
    return AdamWStochasticRounding(params, lr=lr, weight_decay=weight_decay, seed=seed)


# ----- A step filled with signal (DAPO's dynamic sampling), from where a resumed run stands -----

def spread(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[groups] True where a group's rewards differ: the only groups with a gradient (without a KL penalty)."""
    return rewards.view(-1, group_size).diff(dim=1).ne(0).any(1)


def merge_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """A step's batches as one rollout, prompts left-padded, completions right-padded: every row scores as before."""
    prompt, width = max(r.prompt_length for r in parts), max(r.output_ids.shape[1] - r.prompt_length for r in parts)
    pad = lambda r, t, value: F.pad(t, (prompt - r.prompt_length, width + r.prompt_length - t.shape[1]), value=value)
    return Rollout(*(torch.cat([pad(r, getattr(r, name), value) for r in parts]) for name, value in
                     (("output_ids", pad_id), ("attention_mask", 0), ("loss_mask", False))), prompt,
                   [c for r in parts for c in r.completions], *(torch.cat([getattr(r, name) for r in parts]) for name in
                     ("rewards", "advantages", "truncated", "completion_lengths")))


def groups_with_signal(rollout: Rollout, cfg: RunConfig) -> Rollout:
    """The update's --batch-size groups (or --min-signal-groups, if more), those whose rewards differ first."""
    first = torch.argsort(~spread(rollout.rewards, cfg.group_size), stable=True)    # with signal first, in order
    groups = first[:max(cfg.signal_groups, cfg.batch_size)].sort().values
    return rollout_rows(rollout, (groups[:, None] * cfg.group_size + torch.arange(cfg.group_size)).view(-1))


# ----- The run folder: claimed before any work, written only by this run, resumable after any phase -----

RUN_LOCK = "run.lock"
RUN_RECORD = {"config.json", "summary.json", "metrics.jsonl", "eval_before.jsonl", "eval_after.jsonl", "eval.jsonl",
              "before_after.md", "report_draft.md", "plots", "checkpoints", "final", "earlier-ends", RUN_LOCK}
TRAINER_STATE = ("trainer_state.json", "trainer_state.safetensors")      # checkpoints/step-N/'s own, beside the model


def is_run_dir(path: Path) -> bool:
    """A folder this script made for a run: its config.json is a run record, not (say) a model's config."""
    with contextlib.suppress(UserError):            # none, unreadable, or no JSON object
        saved = read_json(path / "config.json")
        return isinstance(saved.get("config"), dict) and "argv" in saved
    return False


def foreign_entries(run_dir: Path, own: set[str] = frozenset({RUN_LOCK})) -> list[str]:
    """What in RUN_DIR this script would not have written (temp files of its own writes count as its own)."""
    return sorted(n for n in os.listdir(run_dir) if n.removesuffix(".tmp") not in own) if run_dir.is_dir() else []


def check_output_dir(run_dir: Path, model_path: str, resume: bool, clearable: Callable[[Path], bool]) -> None:
    """UserError unless RUN_DIR can take this run without touching anything the run did not make."""
    require(not run_dir.exists() or run_dir.is_dir(), f"--output-dir {run_dir} is a file, not a folder")
    model = Path(model_path).expanduser().resolve() if model_path else None
    if model is not None and model.is_dir() and (run_dir.resolve() == model or model in run_dir.resolve().parents):
        raise UserError(f"--output-dir {run_dir} is inside the model folder {model_path}: choose a folder outside it")
    if (others := [] if resume else foreign_entries(run_dir)) and not clearable(run_dir):
        raise UserError(f"{run_dir} already holds a run: pass another --output-dir, or --resume {run_dir}"
                        if is_run_dir(run_dir) else f"--output-dir {run_dir} already holds other files ("
                        f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''}): a run writes only in a new or "
                        f"empty folder")


def lock_run_dir(run_dir: Path) -> int:
    """An exclusive lock on RUN_DIR/run.lock (the system drops it when the process dies); UserError if held."""
    import fcntl
    lock = os.open(run_dir / RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise UserError(f"another run is using {run_dir} right now") from None
    return lock


@contextlib.contextmanager
def claimed_run_dir(run_dir: Path, *, resume: bool, model_path: str = "",
                    clearable: Callable[[Path], bool] = lambda path: False):
    """RUN_DIR, locked, new or empty (or emptied where `clearable` says); without a config.json at the end, undone."""
    lock, made = None, []
    try:
        try:
            check_output_dir(run_dir, model_path, resume, clearable)
            made = [p for p in reversed([run_dir, *run_dir.parents]) if not p.exists()]
            run_dir.mkdir(parents=True, exist_ok=True)
            lock = lock_run_dir(run_dir)
            check_output_dir(run_dir, model_path, resume, clearable)   # again: it may have changed before the lock
            for name in [] if resume else foreign_entries(run_dir):      # only what `clearable` vouched for
                target = run_dir / name
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
        except OSError as e:
            raise UserError(f"cannot use --output-dir {run_dir}: {e.strerror or e}") from None
        yield run_dir
    finally:
        if lock is not None:
            started = (run_dir / "config.json").exists()   # if not: the lock, and a config.json.tmp whose write failed
            for name in () if started else (RUN_LOCK, "config.json.tmp"):
                (run_dir / name).unlink(missing_ok=True)
            os.close(lock)
            for folder in [] if started else reversed(made):
                with contextlib.suppress(OSError):       # not empty: something of the run's own stays
                    folder.rmdir()


class CompiledGeneration:
    """model.generate with transformers' static KV cache, its decoding step compiled by torch.compile, shapes held
    fixed so that a run compiles a few times, not every step: prompts left-padded to a multiple of `width`, rows to
    the next power of two or of `sizes()` (copies of the last row: fewer than twice the rows), both cut off again. A
    failure to compile: one line, and the dynamic cache from then on. `everywhere`: compile on a CPU too."""

    def __init__(self, model, sizes: Callable[[], tuple], width=128, everywhere=False, compile_config=None):
        from transformers import CompileConfig
        self.plain, self.sizes, self.width, self.failed = model.generate, sizes, width, False
        self.compile_config = compile_config or CompileConfig()
        self.compile_config._compile_all_devices = everywhere or self.compile_config._compile_all_devices

    def rows_run(self, rows: int) -> int:
        return min([s for s in self.sizes() if s >= rows] + [1 << (rows - 1).bit_length()])

    def __call__(self, *, input_ids, attention_mask, generation_config, **kwargs):
        dynamic = lambda: self.plain(input_ids=input_ids, attention_mask=attention_mask,
                                     generation_config=generation_config, **kwargs)
        if self.failed or kwargs:           # kwargs: a cache of the caller's own (prefill_once)
            return dynamic()
        rows, extra_cols = len(input_ids), -input_ids.shape[1] % self.width
        extra_rows = self.rows_run(rows) - rows
        pad = lambda t, value: F.pad(torch.cat([t, t[-1:].expand(extra_rows, -1)]), (extra_cols, 0), value=value)
        config = copy.deepcopy(generation_config)
        config.cache_implementation, config.compile_config = "static", self.compile_config
        try:
            return self.plain(input_ids=pad(input_ids, generation_config.pad_token_id), attention_mask=pad(
                attention_mask, 0), generation_config=config)[:rows, extra_cols:]
        except Exception as e:
            if is_out_of_memory(e) or "probability tensor contains" in str(e):     # memory, or NaN in the policy
                raise
            self.failed = first_line(e)
            warn(f"compiled generation failed ({first_line(e)}); generating with the dynamic KV cache from here on "
                 f"(--compile-generation off skips the attempt)")
            return dynamic()


def prefill_once(model, input_ids, attention_mask, num_samples) -> dict:
    """A run's `prefill`: the KV cache of every prompt token but the last, once a prompt, repeated for its samples."""
    import inspect
    from transformers import DynamicCache
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache(config=model.config)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)      # [prompts, prompt] as generate() counts
    model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1], position_ids=positions[:, :-1],
          use_cache=True, logits_to_keep=1, **{name: cache})
    cache.batch_repeat_interleave(num_samples)
    return {name: cache}


@torch.no_grad()
def clip_stats(logprobs, old_logprobs, loss_mask, clip_eps=0.2) -> dict:
    """TODO 3's statistics: the share of tokens whose ratio is past the clip, and approx_kl (k3 of KL(old || new))."""
    mask = loss_mask.bool()
    logratio = torch.where(mask, logprobs.float() - old_logprobs.float(), 0.0).clamp(-20.0, 20.0)
    ratio = torch.exp(logratio)
    return {"clipfrac": masked_token_mean(((ratio < 1.0 - clip_eps) | (ratio > 1.0 + clip_eps)).float(), mask).item(),
            "approx_kl": masked_token_mean((ratio - 1.0) - logratio, mask).item()}


def masked_token_mean(tensor, mask):
    return torch.where(mask.bool(), tensor, 0.0).sum() / mask.bool().sum().clamp(min=1)


def masked_mean_drgrpo(tensor, mask, num_tokens):
    """Sum over masked entries / (num_tokens * rows): every token weighs the same, whatever its row's length."""
    return torch.where(mask.bool(), tensor, 0.0).sum() / (num_tokens * tensor.shape[0])


def kl_k3(logprobs, ref_logprobs):
    """Per-token k3 estimate of KL(policy || reference): exp(ref - lp) - (ref - lp) - 1, >= 0."""
    logratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)               # exp(20) ~ 5e8 keeps fp32 finite
    return torch.exp(logratio) - logratio - 1.0


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[..., vocab] logits -> [...] entropy of softmax(logits) in nats, fp32: entr(0) is 0 (p log p: 0 * -inf)."""
    p = logits.float().softmax(-1)
    return torch.special.entr(p, out=p).sum(-1)


def rollout_rows(rollout: Rollout, rows: torch.Tensor, columns: int | None = None) -> Rollout:
    """These rows only (a tensor of indices), and with `columns` only the first that many columns."""
    def select(value):
        if torch.is_tensor(value):
            value = value[rows.to(value.device)]
            return value[:, :columns] if value.dim() == 2 else value
        return [value[i] for i in rows.tolist()] if isinstance(value, list) else value    # prompt_length stays
    return Rollout(**{name: select(value) for name, value in vars(rollout).items()})


def micro_batch_rows(rollout: Rollout, cfg: RunConfig):
    """(rows, columns, share) of each micro-batch: micro_batch_size rows cut after their last completion column, at
    their share of the batch's rows, so the gradients add up to the whole batch's. Rows whose gradient is exactly 0
    (advantage 0, no reference log-probs to stay near) are left out, their share with them."""
    index = (rollout.loss_mask.any(1).to(rollout.advantages.device) &       # the rows with a gradient
             ((rollout.advantages != 0) | (rollout.ref_logprobs is not None))).nonzero().squeeze(1)
    for start in range(0, len(index), cfg.micro_batch_size):
        rows = index[start:start + cfg.micro_batch_size]
        used = rollout.loss_mask[rows.to(rollout.loss_mask.device)]             # [micro, seq]
        yield rows, int(used.any(0).nonzero()[-1]) + 1, len(rows) / len(rollout.rewards)     # of all the batch's rows


def rollout_logprobs(model, rollout: Rollout, cfg: Config, chunks, out: torch.Tensor | None = None) -> torch.Tensor:
    """[rows, seq] log-probs, no gradient, of the micro-batches `chunks` (micro_batch_rows'), into `out`; the rest 0."""
    out = torch.zeros(rollout.output_ids.shape, device=rollout.output_ids.device) if out is None else out
    was_training, _ = model.training, model.eval()        # no checkpointing of activations nothing backpropagates
    try:
        with torch.no_grad():
            for rows, columns, _ in chunks:
                out[rows, :columns] = compute_logprobs_from_model(
                    model, rollout.output_ids[rows, :columns], rollout.attention_mask[rows, :columns],
                    temperature=cfg.temperature, prompt_length=rollout.prompt_length)
    finally:
        model.train(was_training)
    return out


@dataclass(eq=False)
class UpdateHooks(Hooks):
    """Step 4 as a run takes it: PPO epochs on old log-probs computed once, a KL penalty to a reference, statistics."""
    cfg: Any
    optimizer: Any
    ref_model: Any = None          # the KL penalty's reference, the starting model (--kl-coef)
    model: Any = None

    def __post_init__(self):           # refused, not dropped: the penalty would be 0 in silence
        self.history, self.updates_settled = [], getattr(self.optimizer, "updates_begun", 0)
        if not hasattr(self.cfg, "kl_coef"):
            raise TypeError(f"UpdateHooks reads a run's settings (kl_coef, ppo_epochs): give it a RunConfig, not a "
                            f"{type(self.cfg).__name__}")
        if self.cfg.kl_coef > 0 and self.ref_model is None:
            raise ValueError("kl_coef > 0 needs the reference model: UpdateHooks(cfg, optimizer, ref_model=...)")

    def updates(self, rollout: Rollout):
        """cfg.ppo_epochs updates on the rollout, its old (and reference) log-probs computed once before the first."""
        cfg, model = self.cfg, self.model
        model.train()         # dropout and gradient checkpointing, where a model has them; generation runs in eval
        if cfg.loss_agg == "drgrpo":     # Dr. GRPO's sum / (rows x max_new_tokens) is TODO 3's mean per completion
            lengths = rollout.loss_mask.sum(1).to(rollout.advantages)      # with each advantage x its length / limit
            rollout = dataclasses.replace(rollout, advantages=rollout.advantages * lengths / cfg.max_new_tokens)
        if self.ref_model is not None and cfg.kl_coef > 0:     # every row then has a gradient (its KL): all scored
            rollout.ref_logprobs = torch.zeros(rollout.output_ids.shape, device=rollout.output_ids.device)
        self.chunks = list(micro_batch_rows(rollout, cfg))       # train_grpo's micro-batches; none without a gradient
        if rollout.ref_logprobs is not None:
            with self.ref_model.peft_model.disable_adapter() if hasattr(self.ref_model, "peft_model") else \
                    contextlib.nullcontext():
                rollout_logprobs(self.ref_model, rollout, cfg, self.chunks, rollout.ref_logprobs)
        rollout.old_logprobs = rollout_logprobs(model, rollout, cfg, self.chunks) if cfg.ppo_epochs > 1 else None
        self.covered = sum(weight for *_, weight in self.chunks) or 1.0     # the share of the loss run (0: all masked)
        self.stats = dict(loss=0.0, clipfrac=0.0, approx_kl=0.0, kl_ref=0.0, grad_norm=0.0, policy_kl=0.0,
                          entropy=None, no_signal=not self.chunks, skipped=0)
        self.entropy_sum, self.entropy_tokens, self.logits = 0.0, 0.0, None
        self.capture = model.register_forward_hook(lambda module, args, output: setattr(self, "logits", output.logits))
        try:
            for self.epoch in range(cfg.ppo_epochs):
                self.index, self.loss = 0, 0.0
                yield rollout
        finally:
            self.capture.remove()

    def micro_batches(self, rollout: Rollout):      # self.chunks' rows, micro_batch_size at a time, at their shares
        return ((rollout_rows(rollout, rows, columns), share) for rows, columns, share in self.chunks)

    def record(self, rollout: Rollout, grad_norm: float):
        """After each update its statistics; after the last, how far the policy moved and the step's record, printed."""
        cfg, model = self.cfg, self.model
        self.optimizer.zero_grad(set_to_none=True)        # the gradients' memory, back for generation
        self.updates_settled = getattr(self.optimizer, "updates_begun", 0)
        self.stats["skipped"] += not 0 < grad_norm < math.inf     # clipped_step steps on no other
        if not (math.isfinite(self.loss) and math.isfinite(grad_norm)):
            warn(f"skipped an update with loss {self.loss} and grad norm {grad_norm}")
        self.stats["loss"] += self.loss / cfg.ppo_epochs
        self.stats["grad_norm"] += grad_norm / cfg.ppo_epochs
        if self.epoch < cfg.ppo_epochs - 1:
            return
        self.capture.remove()     # before the measuring pass below
        if self.chunks:           # KL(before || after) on the first micro-batch's tokens
            rows, columns, _ = self.chunks[0]
            after = rollout_logprobs(model, rollout, cfg, self.chunks[:1])[rows.to(rollout.output_ids.device), :columns]
            moved = kl_k3(self.logprobs_before, after)
            self.stats["policy_kl"] = masked_token_mean(moved, rollout_rows(rollout, rows, columns).loss_mask).item()
            tokens = float(self.entropy_tokens)            # none: every completion masked out of the loss
            self.stats["entropy"] = float(self.entropy_sum) / tokens if tokens else None
        self.history.append(self.end_step(rollout, self.stats))
        print(step_line(self.history[-1]))

    def end_step(self, rollout: Rollout, stats: dict) -> dict:      # the step's record
        return {"step": len(self.history) + 1, "reward_mean": rollout.rewards.mean().item(),
                "completion_len_mean": rollout.completion_lengths.float().mean().item(),
                "truncated_frac": rollout.truncated.float().mean().item(), **stats}

    def penalized(self, micro: Rollout, logprobs, loss):
        """The micro-batch's loss plus kl_coef x its k3 KL to the reference (reduced as the loss); its statistics."""
        cfg, mask, weight = self.cfg, micro.loss_mask, self.chunks[self.index][2]
        with torch.no_grad():
            for key, value in clip_stats(logprobs, micro.old(logprobs), mask, cfg.clip_eps).items():
                self.stats[key] += weight / self.covered * value / cfg.ppo_epochs
            if self.epoch == 0:                # the entropy of the policy sampled from, at the completion's tokens
                start = min(max(1, micro.prompt_length), logprobs.shape[1])
                entropy = F.pad(token_entropy(self.logits[:, start - 1:-1].float() / cfg.temperature), (start, 0))
                self.entropy_sum, self.entropy_tokens = self.entropy_sum + entropy[mask].sum(), \
                    self.entropy_tokens + mask.sum()
                self.logprobs_before = logprobs.detach() if self.index == 0 else self.logprobs_before
            self.index, self.logits = self.index + 1, None
        if micro.ref_logprobs is not None:         # its k3 KL, reduced as the loss is (--loss-agg)
            kl = kl_k3(logprobs, micro.ref_logprobs)
            kl = masked_mean_drgrpo(kl, mask, cfg.max_new_tokens) if cfg.loss_agg == "drgrpo" else masked_mean(kl, mask)
            self.stats["kl_ref"] += weight * kl.item() / cfg.ppo_epochs
            loss = loss + cfg.kl_coef * kl
        self.loss += weight * loss.item()
        return loss


@dataclass(eq=False, kw_only=True)
class Run(UpdateHooks):
    """What a run's phases share, and train_grpo's hooks; its cfg is a RunConfig."""
    run_dir: Path
    device: torch.device
    tokenizer: Any
    loader: DataLoader | None
    eval_set: GSM8KDataset
    scheduler: Any = None               # learning-rate schedule, stepped once per step
    start: dict = field(default_factory=lambda: {"step": 0, "epoch": 0, "batch_in_epoch": 0})   # resume here
    summary: dict = field(default_factory=dict)
    t_start: float = field(default_factory=time.perf_counter)
    last_record: dict | None = None   # the last step trained in this process
    rng: dict | None = None           # the random streams as that step left them (a checkpoint continues from there)
    updates_at_record: int = 0        # optimizer updates begun by then: more since means the weights are mid-step
    saved_step: int | None = None     # the step of the newest checkpoint on disk
    metrics_file: Any = None          # metrics.jsonl, open while training
    done: int = 0                     # steps taken
    pool: list = field(default_factory=list)   # the step's rollouts drawn so far
    phase: str = "generation"         # what an out-of-memory error hit: generation or update

    def batches(self, loader, num_epochs: int, device):
        """From where the run stands to its last step, each epoch in the order its sampler gives for (seed, epoch)."""
        for epoch in range(self.start["epoch"], num_epochs):
            loader.sampler.set_epoch(epoch)
            skip = self.start["batch_in_epoch"] if epoch == self.start["epoch"] else 0
            for index, batch in itertools.islice(enumerate(loader), skip, None):
                if not self.pool:                     # a step begins, unless a stop was asked for (Run.train takes it)
                    if _ctrl_c["asked"] or (self.cfg.max_steps and self.done >= self.cfg.max_steps):
                        return
                    self.t0 = time.perf_counter()
                check_ctrl_c()                        # after a Ctrl-C Python dropped
                self.phase, self.position, self.epoch_ends = "generation", (epoch, index + 1), index + 1 == len(loader)
                yield prompts_and_golds(batch, device)

    def updates(self, rollout: Rollout):
        """The step's rollouts pooled until --min-signal-groups groups' rewards differ (DAPO's dynamic sampling; at
        most --max-draws more batches, or to the epoch's end), then UpdateHooks' updates on them."""
        cfg = self.cfg
        self.pool.append(rollout)
        signal = sum(int(spread(r.rewards, cfg.group_size).sum()) for r in self.pool)
        if signal < cfg.signal_groups and len(self.pool) <= cfg.max_draws and not self.epoch_ends:
            return
        self.sampled, self.pool = merge_rollouts(self.pool, self.tokenizer.pad_token_id or 0), []
        self.timing, self.phase = (time.perf_counter() - self.t0, time.perf_counter()), "update"
        yield from super().updates(groups_with_signal(self.sampled, cfg) if cfg.signal_groups else self.sampled)

    generation = property(lambda self: {"batch_size": self.cfg.generation_batch_size, "prefill": None if isinstance(
        self.model.generate, CompiledGeneration) and not self.model.generate.failed else prefill_once})   # read anew

    def retry_smaller(self) -> None:
        """After out-of-memory in a step: the batch of the phase it hit halved, the step taken again from its first
        batch; final once an optimizer update of the step began (a retry would apply it twice)."""
        begun = getattr(self.optimizer, "updates_begun", 0)
        if begun != self.updates_settled and begun != self.updates_at_record:     # in optimizer.step() itself
            raise optimizer_out_of_memory(self.model)
        halve(self.cfg, "micro_batch_size" if self.phase == "update" else "generation_batch_size",
              update_began=begun != self.updates_at_record)
        self.optimizer.zero_grad(set_to_none=True)
        self.pool = []
        if self.last_record:
            self.start = {key: self.last_record[key] for key in self.start}

    def evaluation(self, heading: str, tag: str) -> tuple[dict, list[dict]]:    # greedy, retried on halved batches
        print(f"{heading} on {len(self.eval_set)} {self.cfg.eval_split} problems...")
        return retry_after_oom(lambda: evaluate(self.model, self.tokenizer, self.eval_set, self.cfg, self.device, tag),
                               lambda: halve(self.cfg, "eval_batch_size"))

    def end_step(self, rollout: Rollout, stats: dict) -> dict:
        """The schedule; the record (a metrics.jsonl line on all samples drawn), then checkpoint, summary, plots."""
        cfg, run_dir, lr, sampled = self.cfg, self.run_dir, self.optimizer.param_groups[0]["lr"], self.sampled
        with warnings.catch_warnings():        # counts steps, those without an optimizer step too
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        (epoch, batch_in_epoch), gen_seconds = self.position, self.timing[0]
        update_seconds = time.perf_counter() - self.timing[1]
        rewards, lengths = sampled.rewards.cpu().float(), sampled.completion_lengths.cpu().float()
        has_spread = spread(rewards, cfg.group_size)                               # [groups drawn]
        record = {"step": self.done + 1, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "samples": len(rewards),
                  "prompts_drawn": len(has_spread), "signal_groups": int(spread(rollout.rewards, cfg.group_size).sum()),
                  "reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
                  "zero_spread_frac": (~has_spread).float().mean().item(),
                  **{k: stats[k] for k in ("loss", "clipfrac", "approx_kl", "policy_kl", "grad_norm", "skipped",
                                           "no_signal", "entropy")},
                  "completion_len_mean": lengths.mean().item(), "completion_len_max": int(lengths.max().item()),
                  "truncated_frac": sampled.truncated.cpu().float().mean().item(), "lr": lr,
                  "gen_seconds": gen_seconds, "update_seconds": update_seconds,
                  "tokens_per_s": lengths.sum().item() / max(gen_seconds + update_seconds, 1e-9),
                  **({"kl_ref": stats["kl_ref"]} if cfg.kl_coef > 0 else {})}
        if torch.cuda.is_available():
            record["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        self.done += 1
        self.last_record, self.rng = record, rng_state(self.optimizer)
        self.updates_at_record = getattr(self.optimizer, "updates_begun", 0)
        print(json.dumps(record), file=self.metrics_file, flush=True)  # before the checkpoint: no kill loses a row
        if cfg.save_every and record["step"] % cfg.save_every == 0:
            checkpoint_now(self)
        self.summary.update(steps=record["step"], wall_seconds=time.perf_counter() - self.t_start)
        save_summary(self, f"step {record['step']}")
        if cfg.plot_every and record["step"] % cfg.plot_every == 0:
            write_plots(run_dir, self.summary)
        return record

    def train(self) -> None:
        """train_grpo with this run as its hooks and metrics.jsonl open; Ctrl-C stops it after the step in flight."""
        cfg = self.cfg
        print("Starting GRPO training...")
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()     # step 1's peak_mem_gb is the step's, not the evaluation's
        self.metrics_file = open(own_path(self.run_dir / "metrics.jsonl"), "a")
        _ctrl_c.update(training=True, asked=0.0)
        try:
            retry_after_oom(lambda: train_grpo(self.model, self.tokenizer, self.loader, self.optimizer, self.device,
                                               cfg.num_epochs, cfg.group_size, cfg.clip_eps, cfg.max_new_tokens,
                                               cfg=cfg, hooks=self), self.retry_smaller)
            checkpoint_now(self)      # still under the stop-after-this-step protection: a stop now loses no step
            if _ctrl_c["asked"]:      # the stop asked for: what the run has so far, and what it lacks
                write_plots(self.run_dir, self.summary)
                write_report_draft(self.run_dir)
                raise KeyboardInterrupt
            if cfg.max_steps and (done := self.done) < cfg.max_steps:    # a step draws 1 + --max-draws batches at most
                self.summary["problems_ran_out"] = True
                warn(f"the training problems ran out after step {done}, short of --max-steps {cfg.max_steps} (a step "
                     f"draws up to {1 + cfg.max_draws} batches): add --num-epochs to reach it")
        except Exception:    # a CUDA error, OOM at the smallest batch: save the last step unless an update began since
            if getattr(self.optimizer, "updates_begun", 0) == self.updates_at_record:
                with contextlib.suppress(Exception):      # the failure is the news; a second one would hide it
                    checkpoint_now(self)
            raise
        finally:
            _ctrl_c["training"] = False
            self.metrics_file.close()


def open_record(run: Run, checkpoint: Path | None, resume: bool) -> Run:
    """Continue from `checkpoint` when there is one, trim metrics.jsonl to it, and record the run's config."""
    cfg, run_dir = run.cfg, run.run_dir
    earlier = read_json(run_dir / "config.json") if resume else {}       # the command that started it stays first
    inputs = checked_inputs(run, earlier.get("inputs", {}), reads_model=not checkpoint or cfg.kl_coef or cfg.lora_rank)
    run.summary = read_json(run_dir / "summary.json") if resume and (run_dir / "summary.json").exists() else {}
    before, files = run.summary.get("before"), ("summary.json", "eval_before.jsonl")   # null, {}, "31%": lost too
    lost = [name for name in files if not (run_dir / name).exists()] + ([] if isinstance(before, dict) and type(
        before.get("accuracy")) in (int, float) else ["summary.json's scores before"])
    if checkpoint and lost:       # scoring now would score the trained checkpoint as "the starting model"
        raise UserError(f"--resume {run_dir}: its {lost[0]} is missing, so the starting model's scores are lost and "
                        f"cannot be taken from a trained checkpoint: put it back, or start a new run")
    if checkpoint:
        state = load_trainer_state(checkpoint)
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
        rng = state["rng"][0]
        random.setstate((rng["python"][0], tuple(rng["python"][1]), rng["python"][2]))
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():    # the GPU this process uses, whatever its index
            torch.cuda.set_rng_state(rng["cuda"])
        run.optimizer.load_rounding_state(rng["rounding"])
        run.start = {k: state[k] for k in run.start}
        run.done = run.saved_step = run.start["step"]
        # Finished: at --max-steps, or its problems used up (a step may draw several batches: count batches)
        used_up = run.start["epoch"] >= cfg.num_epochs - 1 and run.start["batch_in_epoch"] >= len(run.loader)
        if run.summary.get("finished") and (used_up or run.start["step"] >= last_step(cfg, run.loader)):
            raise UserError(f"{run_dir} finished after {run.start['step']} steps: " + (
                f"its --lr-decay schedule ended there; start a new run from {run_dir / 'final'}" if cfg.lr_decay
                else f"its training problems ran out; pass a larger --num-epochs (now {cfg.num_epochs}) to train it "
                f"further" if used_up else "pass a larger --max-steps or --num-epochs to train it further"))
        require(not cfg.max_steps or cfg.max_steps >= run.start["step"],        # else it records a limit it went past
                f"--max-steps {cfg.max_steps}: {run_dir} is at step {run.start['step']} already (its newest "
                f"checkpoint); pass at least that, or leave the flag out")
        require(cfg.num_epochs > run.start["epoch"], f"--num-epochs {cfg.num_epochs}: {run_dir} is in epoch "
                f"{run.start['epoch'] + 1} already (its newest checkpoint); pass at least that, or leave the flag out")
        if run.summary.get("finished"):      # trained further: the end it had is no longer this run's end
            run.summary = set_aside_end(run_dir, run.summary)
        print(f"Resuming from {checkpoint} (step {run.start['step']})")
        run.t_start -= run.summary.get("wall_seconds", 0.0)
    elif resume and run.summary.get("finished"):          # its checkpoints were deleted: never retrain over it
        raise UserError(f"{run_dir} finished (--eval-only: its scores are in eval.jsonl)" if cfg.eval_only
                        else f"{run_dir} finished, and it has no checkpoint left to continue from: its trained model "
                        f"is in {run_dir / 'final'}; start a new run from there to train it further")
    elif resume and cfg.eval_only:
        print(f"Resuming {run_dir}: scoring {cfg.model_path} again from its first problem")
    elif resume:
        warn(f"{run_dir} has no checkpoint yet: training starts at step 0 from {cfg.model_path}")
    if resume and not cfg.eval_only:
        write_jsonl(run_dir / "metrics.jsonl",
                    [m for m in read_jsonl(run_dir / "metrics.jsonl", "step") if m["step"] <= run.start["step"]])
    resumes = earlier.get("resumes", []) + [{"argv": sys.argv, "at_step": run.start["step"]}] if resume else []
    versions = {"python": sys.version.split()[0], "torch": torch.__version__} | {
        name: importlib.metadata.version(name) for name in ["transformers"] + ["peft"] * (cfg.lora_rank > 0)}
    ran = {"device": str(run.device), "dtype": cfg.dtype, "generation": "compiled static cache" if isinstance(
        run.model.generate, CompiledGeneration) else "dynamic cache"}      # as resolved: never auto
    write_json(run_dir / "config.json", {"config": dataclasses.asdict(cfg), "ran": ran, "argv": earlier.get(
        "argv", sys.argv), "resumes": resumes, "processes": 1, "versions": versions, "inputs": inputs})
    return run


def set_aside_end(run_dir: Path, summary: dict) -> dict:
    """A finished run trained further: its end (final/, evaluation after, summary) moves to earlier-ends/step-N/."""
    step = summary.get("steps", 0)
    folder = own_path(run_dir / "earlier-ends", folder=True) / f"step-{step}"
    own_path(folder, folder=True).mkdir(parents=True, exist_ok=True)
    write_json(folder / "summary.json", summary)
    for name in ("final", "eval_after.jsonl", "before_after.md", "report_draft.md"):
        if (run_dir / name).exists():
            os.replace(own_path(run_dir / name, folder=name == "final"), own_path(folder / name, name == "final"))
    print(f"{run_dir} had finished at step {step}: its final/ and evaluation after moved to {folder}")
    ended = {k: v for k, v in summary.items() if k not in ("accuracy_after", "after", *flips([], []))}  # finish_run's
    ended.update(finished=False, earlier_ends=summary.get("earlier_ends", []) + [f"earlier-ends/step-{step}"])
    write_json(run_dir / "summary.json", ended)
    return ended


def checked_inputs(run: Run, saved: dict, reads_model: bool) -> dict:
    """Fingerprints of the problems and model a start reads; a resume whose inputs changed is refused."""
    digest = lambda data: hashlib.sha256(json.dumps([data.prompts, data.answers], default=str).encode()).hexdigest()
    inputs = {"train": digest(run.loader.dataset) if run.loader else None, "eval": digest(run.eval_set),
              "model": folder_fingerprint(run.cfg.model_path) if reads_model else saved.get("model")}
    data = f"problems of {run.cfg.dataset or 'the generated task'}"
    names = {"train": f"training {data}", "eval": f"evaluation {data}", "model": f"model folder {run.cfg.model_path}"}
    for key in [k for k in inputs if k in saved and saved[k] != inputs[k]][:1]:
        raise UserError(f"--resume {run.run_dir}: the {names[key]} changed since the run began (their fingerprint "
                        f"differs): put them back as they were, or start a new run")
    return inputs


def folder_fingerprint(path: str) -> str | None:
    """sha256 over a local model folder's files, names and bytes (a few seconds for GBs); None for a hub id."""
    if not (folder := Path(path)).is_dir():
        return None
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        digest.update(file.name.encode() + b"\0")
        with open(file, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def evaluate_before(run: Run) -> None:
    """Greedy accuracy of the starting model (kept from an earlier attempt of this run when there is one)."""
    before = run.summary.get("before") if (run.run_dir / "eval_before.jsonl").exists() else None
    if before is not None:
        same_problems(read_jsonl(run.run_dir / "eval_before.jsonl"), [{"question": q} for q in run.eval_set.questions])
    else:
        before, records = run.evaluation("Evaluating the starting model", "eval before")
        write_jsonl(run.run_dir / "eval_before.jsonl", records)
    print(f"Accuracy before training: {before['accuracy']:.2%} ({len(run.eval_set)} {run.cfg.eval_split} problems, "
          f"format {before['format_rate']:.0%})")
    run.summary = {"accuracy_before": before["accuracy"], "before": before, "steps": run.start["step"],
                   "wall_seconds": time.perf_counter() - run.t_start, "finished": False,
                   **{k: run.summary[k] for k in ("earlier_ends", "generation_fallback") if k in run.summary}}
    save_summary(run, "the evaluation before training")


def score_only(run: Run) -> None:
    """--eval-only: the greedy accuracy of MODEL_PATH as loaded (eval.jsonl; summary.json says what was scored)."""
    cfg = run.cfg
    scores, records = run.evaluation(f"Scoring {cfg.model_path} ({cfg.dtype}, {cfg.max_new_tokens} new tokens)", "eval")
    write_jsonl(run.run_dir / "eval.jsonl", records)
    print(f"Accuracy: {scores['accuracy']:.2%} ({len(records)} {cfg.eval_split} problems, format "
          f"{scores['format_rate']:.0%})")
    problems = f"{cfg.eval_split} " + number_ranges(cfg.eval_start + i for i in run.eval_set.rows)
    scored = {"model": cfg.model_path, "dtype": cfg.dtype, "max_new_tokens": cfg.max_new_tokens, "problems": problems}
    run.summary = {"eval_only": True, "accuracy": scores["accuracy"], "evaluation": scores, "scored": scored,
                   "wall_seconds": time.perf_counter() - run.t_start, "finished": True}
    save_summary(run, "the evaluation")
    write_report_draft(run.run_dir)


def save_summary(run: Run, where: str) -> None:
    """summary.json, saying where compiled generation fell back to the dynamic KV cache and why (the first time)."""
    if (failed := getattr(run.model.generate, "failed", False)) and "generation_fallback" not in run.summary:
        run.summary["generation_fallback"] = {"at": where, "error": failed, "from then on": "dynamic cache"}
    write_json(run.run_dir / "summary.json", run.summary)


def number_ranges(numbers) -> str:
    """Sorted whole numbers as runs: 0, 1, 2, 5, 7, 8 -> '0-2, 5, 7-8'."""
    runs = [[n for _, n in run] for _, run in itertools.groupby(enumerate(sorted(numbers)), lambda p: p[1] - p[0])]
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)


def checkpoint_now(run: Run) -> None:
    if run.last_record is not None and run.last_record["step"] != run.saved_step:
        save_checkpoint(run.run_dir, run.model, run.tokenizer, run.optimizer, run.scheduler, run.last_record, run.rng)
        run.saved_step = run.last_record["step"]
        for old in saved_checkpoints(run.run_dir)[:-run.cfg.keep_checkpoints]:   # [:-0] is empty
            shutil.rmtree(own_path(old, folder=True))


def finish_run(run: Run) -> None:
    """Evaluate the trained policy (checkpointed by Run.train), then write final/ (renamed into place), records."""
    cfg, run_dir = run.cfg, run.run_dir
    print("Training completed!")     # after Run.train's checkpoint: --resume comes back to this point
    after, after_records = run.evaluation("Evaluating the trained model", "eval after")
    before_records = read_jsonl(run_dir / "eval_before.jsonl")
    paired = flips(before_records, after_records)
    print(f"Accuracy after training: {after['accuracy']:.2%}, before {run.summary['accuracy_before']:.2%} (format "
          f"{after['format_rate']:.0%}; {paired['gained']} newly right, {paired['lost']} newly wrong, sign test p = "
          f"{paired['sign_test_p']:.2g}; difference's 95% CI {paired['difference_95'][0]:+.1f} to "
          f"{paired['difference_95'][1]:+.1f} points)")
    show = lambda r: f"{' '.join((r['completion'] or '').split())[-60:]!r} [{'right' if r['correct'] else 'wrong'}]"
    for b, a in list(zip(before_records, after_records))[:cfg.show_examples]:
        print(f"\nQ: {b['question']}\n   gold {show_number(b['gold'])} | before: {show(b)} | after: {show(a)}")
    replace_file(run_dir / "final", lambda tmp: save_model(tmp, run.model, run.tokenizer, final=True), folder=True)
    run.summary.update(accuracy_after=after["accuracy"], after=after, **paired, finished=True, steps=run.done,
                       wall_seconds=time.perf_counter() - run.t_start)
    write_jsonl(run_dir / "eval_after.jsonl", after_records)
    write_plots(run_dir, run.summary)
    write_report_draft(run_dir)
    save_summary(run, "the final evaluation")      # finished only now: a Ctrl-C before resumes
    print(f"Run written to {run_dir}")


# ----- Records and checkpoints: JSON and safetensors, each written whole or not at all -----

def own_path(path: Path, folder: bool = False) -> Path:
    """`path`, checked that this run may write or remove it: no symlink, and a file or folder as this run makes them."""
    if path.is_symlink() or (path.exists() and path.is_dir() != folder):
        raise UserError(f"{path} is not a {'folder' if folder else 'regular file'} of this run; not writing through it")
    return path


def replace_file(path: Path, write: Callable[[Path], Any], folder: bool = False) -> None:
    """write(tmp) then rename tmp over `path` (a folder: the old one removed first): a reader never sees half of it."""
    tmp, _ = own_path(path.with_name(path.name + ".tmp"), folder), own_path(path, folder)
    shutil.rmtree(tmp, ignore_errors=True) if folder else tmp.unlink(missing_ok=True)
    write(tmp)
    if folder:
        shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    replace_file(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n"))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    replace_file(path, lambda tmp: tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows)))


def read_text(path: Path) -> str:
    """A record's text; OSError unless it is a regular file (a FIFO or a device in its place would block forever)."""
    if path.exists() and not path.is_file():
        raise OSError(f"{path} is not a regular file")
    return path.read_text()


def read_json(path: Path) -> dict:
    try:
        value = json.loads(read_text(path))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path} (damaged?): {e}") from None
    require(isinstance(value, dict), f"cannot read {path}: not a JSON object")
    return value


def read_jsonl(path: Path, key: str | None = None) -> list[dict]:
    """Rows of a JSON-lines record (a whole number under `key`); a torn last line is dropped, other damage refused."""
    if not path.exists():
        return []
    try:
        lines = [line for line in read_text(path).splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path} (damaged?): {e}") from None
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:
            require(i == len(lines) - 1, f"{path} line {i + 1} is not JSON: the run record is damaged")
            warn(f"{path}: ignoring a half-written last line")
            continue
        if not isinstance(row, dict) or (key and not (type(row.get(key)) is int and 0 <= row[key] < 2**63)):
            raise UserError(f"{path} line {i + 1} is not a {key or 'JSON'} record: the run record is damaged")
        rows.append(row)
    return rows


def flips(before: list[dict], after: list[dict]) -> dict:
    """Two evaluations of the same problems paired: gained, lost, the exact two-sided sign test over the flips, and
    the accuracy difference's 95% interval in points (Wald's for a paired difference)."""
    gained = sum(a["correct"] and not b["correct"] for b, a in zip(before, after))
    lost = sum(b["correct"] and not a["correct"] for b, a in zip(before, after))
    n, k, problems = gained + lost, min(gained, lost), max(len(before), 1)
    d = (gained - lost) / problems
    half = 1.96 * math.sqrt(max(n / problems - d * d, 0.0) / problems)
    return {"gained": gained, "lost": lost, "difference_95": [100 * (d - half), 100 * (d + half)],
            "sign_test_p": min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0}


def save_model(path: Path, model, tokenizer, final: bool = False) -> None:
    """save_pretrained; under LoRA final/ adds the model merged in fp32 (into bf16, small updates round away)."""
    adapters = model.__dict__.get("peft_model")
    if adapters is not None:
        adapters.save_pretrained(path / "adapter" if final else path)
    if adapters is None or final:
        (adapters.to(torch.float32).merge_and_unload() if adapters is not None else model).save_pretrained(path)
    tokenizer.save_pretrained(path)


def to_plain(obj, tensors: dict[str, torch.Tensor]):
    """JSON of nested dicts, lists and scalars, tensors moved to `tensors`: a checkpoint is never unpickled."""
    if torch.is_tensor(obj):
        tensors[key := str(len(tensors))] = obj.detach().cpu().contiguous()
        return {"tensor": key}
    if isinstance(obj, dict):
        return {"items": [[to_plain(k, tensors), to_plain(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"a checkpoint cannot hold a {type(obj).__name__}")


def from_plain(obj, tensors: dict[str, torch.Tensor]):
    if isinstance(obj, dict):
        return tensors[obj["tensor"]] if "tensor" in obj else \
            {from_plain(k, tensors): from_plain(v, tensors) for k, v in obj["items"]}
    return [from_plain(v, tensors) for v in obj] if isinstance(obj, list) else obj


def rng_state(optimizer) -> dict:
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "rounding": optimizer.rounding_state()}


def save_checkpoint(run_dir: Path, model, tokenizer, optimizer, scheduler, record: dict, rng: dict | None = None):
    """Weights, optimizer, schedule, data position and random streams (`rng`): all a bit-identical resume needs."""
    from safetensors.torch import save_file
    def write(tmp: Path) -> None:
        save_model(tmp, model, tokenizer)
        state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),   # rng: a list, by process
                 "rng": [rng or rng_state(optimizer)], **{k: record[k] for k in ("step", "epoch", "batch_in_epoch")}}
        tensors = {}
        (tmp / TRAINER_STATE[0]).write_text(json.dumps(to_plain(state, tensors)))
        save_file(tensors, tmp / TRAINER_STATE[1])
    replace_file(own_path(run_dir / "checkpoints", folder=True) / f"step-{record['step']}", write, folder=True)


def saved_checkpoints(run_dir: Path) -> list[Path]:        # oldest first, by N: step-10 comes after step-8
    return sorted((p for p in (run_dir / "checkpoints").glob("step-*") if p.name[5:].isdigit()),
                  key=lambda p: int(p.name[5:]))


def load_trainer_state(checkpoint: Path) -> dict:
    from safetensors.torch import load_file
    json_file, tensor_file = (checkpoint / name for name in TRAINER_STATE)
    try:
        state = from_plain(json.loads(read_text(json_file)), load_file(tensor_file))
        if not {"optimizer", "scheduler", "step", "epoch", "batch_in_epoch", "rng"} <= set(state):
            raise ValueError("keys are missing")
        if any(type(state[k]) is not int or state[k] < 0 for k in ("step", "epoch", "batch_in_epoch")) or \
                not {"state", "param_groups"} <= set(dict(state["optimizer"])) or not state["rng"] or \
                any(not {"python", "torch", "cuda", "rounding"} <= set(dict(r)) for r in state["rng"]):
            raise ValueError("a value has the wrong type or range (edited by hand, or an older version?)")
    except Exception as e:      # any damage at all (truncated, edited, absent) means the same to the user
        raise UserError(f"cannot read checkpoint {json_file} + {TRAINER_STATE[1]}: {first_line(e)}") from None
    return state


# ----- Plots and before/after answers -----

def redraw_report(run_dir: Path) -> None:
    require(is_run_dir(run_dir), f"--report {run_dir}: no run record (config.json) there, so it is not a run directory")
    lock, written = None, []
    try:
        lock = lock_run_dir(run_dir) if (run_dir / RUN_LOCK).exists() else None     # refused while the run is live
        with tempfile.TemporaryDirectory(prefix=".report-", dir=run_dir, ignore_cleanup_errors=True) as staging:
            for path in write_plots(run_dir, into=Path(staging)) + [write_report_draft(run_dir, into=Path(staging))]:
                own_path((target := run_dir / path.relative_to(staging)).parent, folder=True).mkdir(exist_ok=True)
                os.replace(path, own_path(target))      # each file drawn whole, then moved in
                written.append(target)
    except KeyboardInterrupt:
        replaced = ", ".join(str(p.relative_to(run_dir)) for p in written)
        raise UserError(f"--report {run_dir}: interrupted; " + (f"replaced {replaced}, the rest are as they were"
                                                                 if written else "nothing was changed")) from None
    except (KeyError, TypeError, ValueError, ArithmeticError) as e:
        raise UserError(f"--report {run_dir}: the run record is damaged ({type(e).__name__}: {e})") from None
    except OSError as e:
        raise UserError(f"--report {run_dir}: cannot write there ({e.strerror or e})") from None
    finally:
        if lock is not None:
            os.close(lock)
    print("\n".join(str(p) for p in written))


def recorded_config(run_dir: Path) -> dict:
    return read_json(run_dir / "config.json").get("config", {}) if (run_dir / "config.json").is_file() else {}


def write_plots(run_dir: Path, summary: dict | None = None, into: Path | None = None) -> list[Path]:
    """Reward, length, clip fraction, KL and entropy per step, as PNGs in RUN_DIR/plots (or `into`/plots), with
    `summary`'s accuracy; records from before entropy and policy_kl were logged leave gaps."""
    from matplotlib.figure import Figure      # pyplot's global figures and GUI backend play no part in a file
    metrics = [{"entropy": None, "policy_kl": None, **m} for m in read_jsonl(run_dir / "metrics.jsonl", key="step")]
    if not metrics:
        return []
    if summary is None:
        summary = read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
    (plots := own_path((into or run_dir) / "plots", folder=True)).mkdir(exist_ok=True)
    steps, saved = [m["step"] for m in metrics], recorded_config(run_dir)
    bonus, split = saved.get("format_reward") or 0, saved.get("eval_split", "test")
    column = lambda key: [math.nan if m[key] is None else m[key] for m in metrics]   # None: a gap (entropy)
    rewards, window = column("reward_mean"), max(1, len(metrics) // 20)     # a moving mean from 40 steps on
    kl = [("clip fraction", column("clipfrac")), ("approx KL to sampler", column("approx_kl")),
          ("KL, policy before to after the step", column("policy_kl"))] + (
        [("k3 KL to reference", column("kl_ref"))] if "kl_ref" in metrics[0] else [])
    moving = [sum(rewards[max(0, i + 1 - window):i + 1]) / min(i + 1, window) for i in range(len(rewards))]
    accuracy = [(f"greedy {split} accuracy {when} ({summary[key]:.1%})", summary[key], color) for when, key, color in
                (("before", "accuracy_before", "tab:red"), ("after", "accuracy_after", "tab:green")) if key in summary]
    figures = {   # name: title, y label, [(label, values)], horizontal lines
        "reward.png": ("Mean reward of sampled completions" + (f" (1 if right, + {bonus} if well formed)" if bonus
                       else ""), "reward; greedy accuracy (dashed)", [("per step", rewards)] + [
            (f"moving mean ({window} steps)", moving)] * (window > 1), accuracy),
        "length.png": ("Completion length", "tokens", [("mean", column("completion_len_mean")),
                                                       ("max", column("completion_len_max"))], []),
        "clip_kl.png": ("Clip fraction and KL", "value", kl, []),
        "entropy.png": ("Entropy of the policy on its samples (per completion token)", "nats",
                        [("mean over the completions the update ran", column("entropy"))], [])}
    for name, (title, ylabel, series, hlines) in figures.items():
        ax = Figure(figsize=(7, 4)).subplots()
        for label, values in series:    # dots keep a lone step visible: a short run, or one between two gaps
            ax.plot(steps, values, ".-" if name == "entropy.png" or len(steps) <= 30 else "-", label=label)
        if all(math.isnan(v) for _, values in series for v in values):
            ax.text(0.5, 0.5, "not measured: no step ran an update pass\n(every group's rewards were equal)",
                    transform=ax.transAxes, ha="center", va="center")
        for label, y, color in hlines:
            ax.axhline(y, color=color, linestyle="--", label=label)
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        ax.figure.tight_layout()
        replace_file(plots / name, lambda tmp: ax.figure.savefig(tmp, dpi=110, format="png"))
    return [plots / name for name in figures]


def fenced(text: str) -> list[str]:
    """`text` as written, in a code block: its fence is longer than any run of backticks inside."""
    fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
    return [fence + "text", text, fence]


def show_number(value):
    """18.0 as 18: golds and answers are read as floats; no answer read: none."""
    return "none" if value is None else int(value) if isinstance(value, float) and value.is_integer() else value


def same_problems(before: list[dict], after: list[dict]) -> None:
    if [r["question"] for r in before] != [r["question"] for r in after]:
        raise UserError("eval_before.jsonl holds other problems than the evaluation after training (the data changed "
                        "on disk?): the accuracies and answers cannot be compared")


# report_draft.md's first section in plain words, by the settings a run recorded
ADVANTAGE_WORDS = {"grpo": ("(r - group mean) / (group std + {advantage_eps:g})", "A_i = (r_i - mean of its group) / "
                            "(std of its group + {advantage_eps:g}), the GRPO paper's"),
                   "drgrpo": ("r - group mean", "A_i = r_i - mean of its group, not divided by the std (Dr. GRPO)")}
REDUCTION_WORDS = {"drgrpo": ("sum / (answers x {max_new_tokens})", "summed over every answer token and divided by "
                              "answers x {max_new_tokens} (the token limit): an answer's length does not reweight its "
                              "tokens (Dr. GRPO)"),
                   "seq-mean": ("mean per answer, then over answers", "averaged over each answer's tokens, then over "
                                "answers (the GRPO paper's)")}
STEP_COLUMNS = "| step | sampled reward | loss | grad norm | policy moved (KL) | entropy | mean length | cut off |"


def write_report_draft(run_dir: Path, into: Path | None = None) -> Path:
    """report_draft.md: the handout's four report sections as far as the run's records hold them, and what they lack."""
    c = {**dataclasses.asdict(RunConfig()), **recorded_config(run_dir)}      # an older record lacks newer settings
    summary = read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
    before = read_jsonl(run_dir / ("eval.jsonl" if c["eval_only"] else "eval_before.jsonl"))
    after = [] if c["eval_only"] else read_jsonl(run_dir / "eval_after.jsonl")
    model, budget = Path(c["model_path"]).name, c["max_new_tokens"]
    accuracy = lambda rows: f"{sum(r['correct'] for r in rows) / len(rows):.1%}" if rows else "not scored"
    lines = [f"# Report draft: GRPO on {model}", "", "Every figure here is read from this run's records (config.json, "
             "summary.json, metrics.jsonl, eval_*.jsonl) by grpo_homework.py; your name, ID and reasons are yours.",
             "", "## Results", ""]
    if c["eval_only"]:
        problems = summary.get("scored", {}).get("problems", f"{len(before)} {c['eval_split']}")
        lines += ["| model | problems | max new tokens | accuracy |", "|---|---|---|---|", f"| {model} ({c['dtype']})"
                  f" | {problems} | {budget} | {accuracy(before)} |", "", "An --eval-only scoring, greedy: nothing "
                  "trained, so there are no hyperparameters, training log or answers before and after."]
    else:
        compared = "- | - | -"
        if before and after:
            same_problems(before, after)
            paired = flips(before, after)
            low, high = paired["difference_95"]
            compared = f"{100 * (paired['gained'] - paired['lost']) / len(before):+.1f} ({low:+.1f} to {high:+.1f}) " \
                       f"| {paired['gained']} / {paired['lost']} | {paired['sign_test_p']:.3g}"
        lines += ["| problems | max new tokens | accuracy before | after | difference, points (95% CI) | newly right / "
                  "newly wrong | p |", "|---|---|---|---|---|---|---|", f"| {len(before or after)} {c['eval_split']} | "
                  f"{budget} | {accuracy(before)} | {accuracy(after)} | {compared} |", "", "Greedy answers. "
                  "Difference: accuracy after minus before, in percentage points; CI: Wald's interval for a paired "
                  "difference, d +- 1.96 sqrt(((g + l) / n - d^2) / n) over n problems, g newly right (right only "
                  "after), l newly wrong; p: the two-sided exact sign test over the g + l problems that flipped."]
        if missing := [f"the evaluation {when} training (eval_{when}.jsonl)" for when, rows in
                       (("before", before), ("after", after)) if not rows]:
            lines += ["", f"Missing: {' and '.join(missing)}; " + ("the run finished, so they were removed from its "
                          "folder" if summary.get("finished") else f"the run is at step {summary.get('steps', 0)}: "
                          f"`python grpo_homework.py --resume {run_dir}` finishes it") + "."]
        lines += draft_sections(c, summary, read_jsonl(run_dir / "metrics.jsonl", "step"), before, after)
    replace_file(path := (into or run_dir) / "report_draft.md", lambda tmp: tmp.write_text("\n".join(lines) + "\n"))
    return path


def draft_sections(c: dict, summary: dict, metrics: list[dict], before: list[dict], after: list[dict]) -> list[str]:
    """Sections 1-4: the method as `c` ran it, the hyperparameters, every Nth step, the answers (3 flips each way)."""
    signal_groups = RunConfig(min_signal_groups=c["min_signal_groups"], batch_size=c["batch_size"]).signal_groups
    low, high = 1 - c["clip_eps"], 1 + c["clip_eps"]
    lines = ["", "## 1. Algorithm and implementation, as this run ran", "",
             "- Reward: 1 if the number after the last marker (####, \\boxed{, 'answer is') is the gold, else 0" + (
                 f", plus {c['format_reward']:g} for a well-formed last line" if c["format_reward"] else "") + (
                 "; only the last line's number counts" if c["strict_answer"] else "") + ".",
             f"- Advantage, per group of {c['group_size']} answers to one question: "
             f"{ADVANTAGE_WORDS[c['advantage']][1].format(**c)}.",
             f"- Loss per answer token: -min(rho A, clip(rho, {low:g}, {high:g}) A), rho = "
             "pi_new(token) / pi_old(token); " + (f"{c['ppo_epochs']} updates per batch on the same answers, pi_old "
             "their log-probabilities before the first" if c["ppo_epochs"] > 1 else "one update per batch, so rho = "
             "1 and the clip never acts: a token's gradient is -A times its log-probability's") + (
                 "; answers cut off at the limit left out" if c["mask_truncated"] else "") + ".",
             f"- Reduction: {REDUCTION_WORDS[c['loss_agg']][1].format(**c)}; " + (
                 f"plus {c['kl_coef']:g} x the k3 KL divergence to the starting model." if c["kl_coef"] else
                 "no KL penalty."),
             f"- Step: {c['batch_size']} questions x {c['group_size']} answers sampled at temperature "
             f"{c['temperature']:g}, one AdamW step on the gradient clipped at norm {c['max_grad_norm']:g}" + (
                 f"; up to {c['max_draws']} more batches drawn until {signal_groups} groups' rewards differ"
                 if signal_groups else "") + "."]
    schedule = (f"warm-up {c['lr_warmup_steps']} steps, then " if c["lr_warmup_steps"] else "") + (
        "linear decay to 0" if c["lr_decay"] else "constant")
    targets = "every linear layer but the output layer" if c["lora_targets"] == "all-linear" else c["lora_targets"]
    settings = {"model": Path(c["model_path"]).name, "dtype": c["dtype"], "weights trained": f"LoRA rank "
                f"{c['lora_rank']}, alpha {c['lora_alpha']}, in {targets}" if c["lora_rank"] else "all",
                "questions x answers per update": f"{max(signal_groups, c['batch_size'])} x {c['group_size']}" + (
                    f", from up to {(1 + c['max_draws']) * c['batch_size']} questions drawn" if signal_groups else ""),
                "max new tokens": c["max_new_tokens"], "temperature": f"{c['temperature']:g}",
                "learning rate; schedule": f"{c['learning_rate']:g}; {schedule}",
                "optimizer": f"AdamW, weight decay {c['weight_decay']:g}" + (
                    "; bf16 weights rounded stochastically" if c["dtype"] == "bfloat16" else ""),
                "clip range": f"{low:g} to {high:g}", "KL penalty": f"{c['kl_coef']:g}",
                "loss reduction": REDUCTION_WORDS[c["loss_agg"]][0].format(**c),
                "advantage": ADVANTAGE_WORDS[c["advantage"]][0].format(**c), "steps run": f"{summary.get('steps', 0)}"
                + (f" of {c['max_steps']} at most" if c["max_steps"] else ""), "seed": c["seed"]}
    lines += ["", "## 2. Training hyperparameters", "", "| setting | value |", "|---|---|",
              *(f"| {name} | {value} |" for name, value in settings.items()), "", "## 3. Training log", ""]
    every, show = max(1, len(metrics) // 4), lambda value, form: "-" if value is None else format(value, form)
    lines += [*(f"![{name}](plots/{name})" for name in ("reward.png", "length.png", "clip_kl.png", "entropy.png")),
              "", ("Every step" if every == 1 else f"Step 1, each step divisible by {every}, and the last") + ": grad "
              "norm before clipping; policy moved: mean per-token KL divergence, policy before the step to after; "
              "entropy per answer token; both in nats (natural-log units); cut off: share of answers at the limit.", "",
              STEP_COLUMNS, "|---|---|---|---|---|---|---|---|"] + [
        f"| {m['step']} | {m['reward_mean']:.3f} | {show(m['loss'], '.4f')} | {show(m['grad_norm'], '.3f')} | "
        f"{show(m['policy_kl'], '.5f')} | {show(m.get('entropy'), '.3f')} | {m['completion_len_mean']:.0f} | "
        f"{m['truncated_frac']:.2f} |" for m in metrics if m is metrics[0] or m["step"] % every == 0 or
        m is metrics[-1]] if metrics else ["No training step is recorded yet."]
    lines += ["", "## 4. Answers before and after", ""]
    if not (before and after):
        return lines + ["Not yet: this needs both evaluations (Results)."]
    ended = lambda rows: [r for r in rows if not r["truncated"]]       # answers that stopped within the limit
    columns = [(len(rows) - len(ended(rows)), f"{sum(r['tokens'] for r in rows) / len(rows):.0f}",
                f"{sum(r['correct'] for r in ended(rows))} of {len(ended(rows))}") for rows in (before, after)]
    lines += [f"The {len(before)} answers: one is cut off when it reaches the limit of {c['max_new_tokens']} new "
              "tokens before its end.", "", "| answers | before | after |", "|---|---|---|"]
    lines += [f"| {name} | {b} | {a} |" for name, b, a in zip(("cut off", "mean tokens", "right, of those that "
                                                               "ended in time"), *columns)] + [""]
    for title, flip in (("Wrong before, right after", (False, True)), ("Right before, wrong after", (True, False))):
        chosen = [(i, b, a) for i, (b, a) in enumerate(zip(before, after), 1) if (b["correct"], a["correct"]) == flip]
        lines += [f"### {title}: {len(chosen)}" + (", the first 3 in problem order" if len(chosen) > 3 else ""), ""]
        for line, b, a in chosen[:3]:        # each answer whole, as the model wrote it
            lines += [f"#### Line {line} of eval_before.jsonl and eval_after.jsonl: gold {show_number(b['gold'])}",
                      "", *fenced(b["question"]), ""]
            for when, r in (("Before", b), ("After", a)):
                lines += [f"{when}: {r['tokens']} tokens, {'cut off' if r['truncated'] else 'ended'}; answer read: "
                          f"{show_number(r['extracted'])}, {'right' if r['correct'] else 'wrong'}.", "",
                          *fenced(r["completion"] or ""), ""]
    return lines


# ----- Devices, precision and memory: bf16 with stochastic rounding, out-of-memory, the LM head's input -----

def require_gpu(name: str) -> None:
    if name.startswith("cuda") and int(name.partition(":")[2] or 0) >= torch.cuda.device_count():
        raise UserError(f"--device {name}: there are {torch.cuda.device_count()} CUDA GPUs here")


def pick_device(name: str) -> torch.device:
    if name == "auto" and not torch.cuda.is_available():
        warn("no CUDA GPU found, running on CPU (fine for the demo and tests, far too slow for Qwen2.5-1.5B)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else torch.device(name)
    if device.type == "cuda":
        require_gpu(name)
        # set_device needs an index: the current GPU's if --device gives none
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)      # memory statistics, empty_cache and RNG state then act on this GPU
    return device


def weight_dtype(name: str, device: torch.device) -> torch.dtype:
    """--dtype auto: bf16 where native (GPUs from compute capability 8.0, CPUs with AVX512-BF16 or AMX), else fp32."""
    if name != "auto":
        return getattr(torch, name)
    if device.type != "cuda":            # a CPU with AVX512-BF16 or AMX: bf16 is ~2x fp32 (tests/bench_dtype.py)
        native = [getattr(torch.cpu, f"_is_{unit}_supported", lambda: False)() for unit in ("avx512_bf16", "amx_tile")]
        return torch.bfloat16 if device.type == "cpu" and any(native) else torch.float32
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 8:
        return torch.bfloat16
    warn(f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) has no native bf16: float32 "
         f"weights and gradients take twice the memory (Qwen2.5-1.5B with AdamW: 23.0 GiB, not 17.3)")
    return torch.float32


def check_kv_cache_fits(cfg: RunConfig, model, device: torch.device) -> None:
    """On a CPU, refuse a batch whose KV cache outgrows the memory left (the OS would kill the run without a word)."""
    config, available = getattr(model, "config", None), None
    with contextlib.suppress(OSError, ValueError, TypeError):       # what the kernel says a process can take
        available = int(re.search(r"^MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)[1]) * 1024
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (getattr(config, "hidden_size", 0) // heads if heads else None)
    layers, kv_heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_key_value_heads", None) or heads
    if device.type != "cpu" or available is None or not (layers and kv_heads and head_dim):
        return
    per_token = 2 * layers * kv_heads * head_dim * next(model.parameters()).element_size()    # keys and values
    compiled = model.generate if isinstance(model.generate, CompiledGeneration) else None     # pads what it runs
    columns = cfg.max_prompt_length + (-cfg.max_prompt_length % compiled.width if compiled else 0) + cfg.max_new_tokens
    for flag, rows in [("--eval-batch-size", cfg.eval_batch_size)] + ([] if cfg.eval_only else [
            ("--generation-batch-size", min(cfg.generation_batch_size, cfg.batch_size * cfg.group_size))]):
        need = (rows := compiled.rows_run(rows) if compiled else rows) * columns * per_token
        require(need <= available, f"{flag} {rows} x {columns} tokens would need a {need / 2**30:,.0f} GiB KV cache, "
                f"more than the {available / 2**30:,.1f} GiB of memory available: lower it (--group-size divides "
                f"--generation-batch-size)")


def enable_checkpointing(model) -> None:
    """Activation checkpointing for the update (gradient_checkpointing_enable before transformers 5.x renamed it)."""
    if hasattr(model, "activation_checkpointing_enable"):
        return model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class AdamWStochasticRounding(torch.optim.Optimizer):
    """AdamW with fp32 moments, its update written to bf16 weights by stochastic rounding (round-to-nearest drops
    nearly every update at lr 1e-6); slices keep temporaries ~100 MB; the noise's generator is checkpointed."""
    SLICE = 1 << 22

    def __init__(self, params, lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, seed=0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.seed, self.generators = seed, {}

    def generator(self, device: torch.device) -> torch.Generator:
        if str(device) not in self.generators:
            self.generators[str(device)] = torch.Generator(device).manual_seed(self.seed)
        return self.generators[str(device)]

    @torch.no_grad()
    def step(self, closure=None):
        self.updates_begun = getattr(self, "updates_begun", 0) + 1    # a failure from here leaves weights mid-update
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in [p for p in group["params"] if p.grad is not None]:
                if not (state := self.state[p]):
                    state.update(step=0, exp_avg=torch.zeros_like(p, dtype=torch.float32),
                                 exp_avg_sq=torch.zeros_like(p, dtype=torch.float32))
                state["step"] += 1
                bias1, bias2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
                weight, grad, exp_avg, exp_avg_sq = (t.view(-1) for t in (p, p.grad, state["exp_avg"],
                                                                          state["exp_avg_sq"]))
                for s in range(0, weight.numel(), self.SLICE):
                    part = slice(s, s + self.SLICE)
                    g = grad[part].float()
                    exp_avg[part].lerp_(g, 1 - beta1)
                    exp_avg_sq[part].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    denom = (exp_avg_sq[part] / bias2).sqrt_().add_(group["eps"])
                    new = weight[part].float().mul_(1 - group["lr"] * group["weight_decay"])
                    new.addcdiv_(exp_avg[part], denom, value=-group["lr"] / bias1)
                    weight[part].copy_(stochastic_round_to_bf16(new, self.generator(new.device))
                                       if weight.dtype == torch.bfloat16 else new)

    def load_state_dict(self, state_dict: dict) -> None:
        """The saved fp32 moments as they were: torch casts them to the bf16 weights' dtype (the next step fails)."""
        super().load_state_dict(state_dict)
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            for i, p in zip(saved["params"], group["params"]):
                for key, value in state_dict["state"].get(i, {}).items():
                    if torch.is_tensor(value) and value.is_floating_point() and key != "step":
                        self.state[p][key] = value.to(device=p.device, copy=True)

    def rounding_state(self) -> dict:
        return {device: g.get_state() for device, g in self.generators.items()}

    def load_rounding_state(self, states: dict) -> None:
        """The saved noise of each device the weights are on (another device's starts a fresh stream)."""
        here = {str(p.device) for group in self.param_groups for p in group["params"]}
        for device in [d for d in states if d in here]:
            self.generator(torch.device(device)).set_state(states[device])


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """bf16 keeps the top 16 bits of an fp32: add uniform noise to the low 16, then truncate."""
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    return ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)


def is_out_of_memory(error: BaseException) -> bool:
    """torch's OutOfMemoryError, or an allocation failure that a library reports as a plain RuntimeError."""
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError) and bool(
        re.search(r"out of memory|ALLOC_FAILED|failed to allocate", str(error), re.IGNORECASE)))


def optimizer_out_of_memory(model) -> "UserError":
    """Out of memory in optimizer.step(), final (a retry would step twice): what it holds, what would make it fit."""
    trained = [p for p in model.parameters() if p.requires_grad]
    gib = lambda params, size=0: sum(p.numel() * (size or p.element_size()) for p in params) / 2**30
    lora = "--lora-rank 16 (adapters only), " if len(trained) == len(list(model.parameters())) else ""
    return UserError(f"out of memory in the optimizer step: weights {gib(model.parameters()):.1f} GiB + gradients "
                     f"{gib(trained):.1f} GiB + AdamW moments {gib(trained, 8):.1f} GiB (fp32) do not fit beside "
                     f"the rest. Smaller batches do not help here; {lora}--dtype bfloat16 if the weights are "
                     f"float32, {'no --kl-coef (its reference copy), ' if lora else ''}or a smaller model would. "
                     f"This step was not applied and no checkpoint was written after it")


class OutOfMemory(Exception):
    """Out of memory where this process cannot retry: a resume can, with `resume_flags` (its line names them)."""
    def __init__(self, message: str, resume_flags: str = ""):
        super().__init__(message)
        self.resume_flags = resume_flags


def halve(cfg: Config, knob: str, update_began: bool = False) -> None:
    """cfg.<knob> halved after out-of-memory, down to its floor; past it, or once an update began, OutOfMemory."""
    torch.cuda.empty_cache()        # a no-op unless CUDA is in use
    size, flag = getattr(cfg, knob), flag_name(knob)
    floor = cfg.group_size if knob == "generation_batch_size" else 1
    halved = max(floor, (size // 2) // floor * floor)
    smaller = f" {flag} {halved}" if size > floor else ""
    if update_began:
        raise OutOfMemory("out of memory after this step's optimizer update began: not retried, which would apply "
                          "it twice", smaller) from None
    if not smaller:
        raise OutOfMemory(f"out of memory even at {flag} {size}: resume on a device with more free memory, or start "
                          f"anew with lower --max-new-tokens, --group-size or --batch-size") from None
    setattr(cfg, knob, halved)
    warn(f"out of GPU memory; retrying with{smaller}")


def retry_after_oom(fn: Callable[[], Any], smaller: Callable[[], None]):
    """fn(), run again after each out-of-memory error once smaller() has halved a batch (it raises at the floor)."""
    while True:
        try:
            return fn()
        except RuntimeError as e:
            if not is_out_of_memory(e):
                raise
            smaller()


def contiguous_lm_head_input(model) -> None:
    """A contiguous input for the LM head: on generate()'s strided slice, oneDNN's bf16 matmul with a frozen head asks
    27 GB for 100 rows, fails, and turns itself off for the process (every bf16 matmul ~10x slower)."""
    head = model.get_output_embeddings()
    if head is not None and not getattr(head, "contiguous_input", False):
        head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
        head.contiguous_input = True


def with_lora(model, cfg: RunConfig, checkpoint: Path | None):
    """The model with peft's LoRA adapters (new or a checkpoint's) in its linear layers; the wrapper kept to save."""
    from peft import LoraConfig, PeftModel, get_peft_model
    targets = cfg.lora_targets if cfg.lora_targets == "all-linear" else re.findall(r"[^,\s]+", cfg.lora_targets)
    # Only the body's linear layers (Qwen ties its embedding to the head); a misspelt name would pass in silence
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.base_model.named_modules()
                     if type(module) is torch.nn.Linear})
    if targets != "all-linear" and (unknown := [t for t in targets if t not in linear]):
        raise UserError(f"--lora-targets {cfg.lora_targets}: {', '.join(map(repr, unknown))} is not among the body's "
                        f"linear layers, which take adapters here: {','.join(linear)}")
    with warnings.catch_warnings():      # peft reads transformers' deprecated is_gradient_checkpointing: not ours
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        try:
            wrapper = PeftModel.from_pretrained(model, str(checkpoint), is_trainable=True) if checkpoint else \
                get_peft_model(model, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
        except Exception as e:      # a damaged checkpoint surfaces as any of several types; peft's word for targets
            raise UserError(f"cannot read the adapters of checkpoint {checkpoint} (adapter_config.json and "
                            f"adapter_model.safetensors): {first_line(e)}" if checkpoint else
                            f"--lora-targets {cfg.lora_targets}: {first_line(e)}") from None
    model = wrapper.get_base_model()
    model.__dict__["peft_model"] = wrapper      # a plain attribute: not a submodule, so state_dict() stays the model's
    return model


# ----- Data and generated tasks: loading hub-layout folders, and word problems -----

def load_split(dataset: str, split: str):
    """GSM8KDataset's loading, in one line on failure; never a run folder's files; a fresh cache for a folder."""
    import datasets
    local, is_local = Path(dataset), looks_local(dataset)
    layout = "GSM8K in hub layout (main/train-*.parquet and main/test-*.parquet)"
    require(not is_local or local.is_dir(), f"--dataset {dataset} is a file: pass the folder that holds {layout}"
            if local.exists() else f"dataset folder {dataset} does not exist: put {layout} there (e.g. `git clone "
            f"https://huggingface.co/datasets/openai/gsm8k`) or pass --dataset openai/gsm8k")
    require(not is_local or any(local.iterdir()), f"dataset folder {dataset} is empty: put {layout} there")
    try:
        name = "main" if not is_local or "main" in datasets.get_dataset_config_names(dataset) else None
        with tempfile.TemporaryDirectory() as cache:
            rows = datasets.load_dataset(dataset, name, split=split, **(
                {"cache_dir": cache, "keep_in_memory": True} if is_local else {}),
                data_files=None if name else data_files_outside_runs(local))
    except Exception as e:  # datasets raises many types for a bad slice, config or path
        if "corresponds to no data" in str(e):
            raise UserError(f"split {split!r} of {dataset} has no rows (a start past its end? lower --eval-start or "
                            f"--val-size)") from None
        cause = e
        while cause.__cause__ or cause.__context__:        # under "An error occurred while generating the dataset"
            cause = cause.__cause__ or cause.__context__
        where = f"split {split!r} of" if cause is e else "the splits of"    # building them all failed, maybe not this
        empty = " (a split with no rows?)" if type(cause).__name__ == "SchemaInferenceError" else ""
        raise UserError(f"cannot load {where} {dataset}{empty}: {type(cause).__name__}: {first_line(cause)}") from None
    return enough_rows(rows, split, dataset)


def data_files_outside_runs(folder: Path) -> dict | None:
    """None (datasets infers), unless a run folder in `folder` holds split files (eval_*.jsonl): the others, tabular."""
    from datasets.data_files import DataFilesDict, get_data_patterns
    inferred = DataFilesDict.from_patterns(get_data_patterns(str(folder)), base_path=str(folder))
    in_run = lambda file: any(is_run_dir(d) for d in Path(file).parents if folder.resolve() in d.resolve().parents)
    if not any(in_run(file) for found in inferred.values() for file in found):
        return None
    keep = lambda file: not in_run(file) and Path(file).suffix in (".parquet", ".arrow", ".json", ".jsonl", ".csv")
    return {split: [f for f in found if keep(f)] for split, found in inferred.items() if any(map(keep, found))}


def enough_rows(rows, split: str, dataset: str = ""):
    """`rows`, unless the split asked for [A:B] and fewer came, or [A:] and none (datasets clamps a slice silently)."""
    asked = re.fullmatch(r"(\w+)\[(\d*):(\d*)\]", split)
    if asked and (len(rows) < int(asked.group(3)) - int(asked.group(2) or 0) if asked.group(3) else not len(rows)):
        what = f"{asked.group(1)} problems in {dataset}" if dataset else f"generated {asked.group(1)} problems"
        raise UserError(f"there are only {len(rows)} {what} in {split} (lower --train-size, --eval-size, --val-size, "
                        f"--eval-start)")
    return rows


def checked_problems(rows, where: str) -> tuple[list[str], list, list[int]]:
    """Questions, golds and row numbers of the GSM8K-format `rows` that can train; UserError when missing columns,
    questions not text or more than a few golds that do not parse (reward 0 whatever the model says) mean bad data."""
    columns = set(rows.column_names) if hasattr(rows, "column_names") else set(rows[0]) if len(rows) else set()
    if len(rows) and (missing := sorted({"question", "answer"} - columns)):
        raise UserError(f"{where} has no {' and no '.join(map(repr, missing))} column (GSM8K's are 'question' and "
                        f"'answer'; it has {sorted(columns)})")
    def few(bad: list[int], refused: str, dropped: str, show: Callable[[int], str] = lambda i: "", hint="") -> set:
        if len(bad) > 0.01 * len(rows):
            raise UserError(f"{where}: {len(bad)} of {len(rows)} {refused} (first at row {bad[0]}{show(bad[0])}){hint}")
        if bad:
            warn(f"{where}: dropped {len(bad)} of {len(rows)} problems whose {dropped}")
        return set(bad)
    questions, golds = [row["question"] for row in rows], [GSM8KDataset.extract_answer(row["answer"]) for row in rows]
    skip = few([i for i, q in enumerate(questions) if not isinstance(q, str) or not q.strip()],
               "questions are not text", "question is empty or not text")
    skip |= few([i for i, g in enumerate(golds) if g is None and i not in skip], "gold answers give no number",
                "gold answer gives no number", lambda i: f": {rows[i]!r:.80}", "; GSM8K answers end in '#### <number>'")
    keep = [i for i in range(len(rows)) if i not in skip]
    return [questions[i] for i in keep], [golds[i] for i in keep], keep


def write_hub_dataset(folder: str | Path, splits: dict[str, list[dict]]) -> Path:
    """Write rows in the hub layout of openai/gsm8k (config 'main', one parquet file per split)."""
    import datasets
    (folder := Path(folder)).joinpath("main").mkdir(parents=True, exist_ok=True)
    files = "".join(f"  - split: {s}\n    path: main/{s}-*\n" for s in splits)
    (folder / "README.md").write_text(f"---\nconfigs:\n- config_name: main\n  data_files:\n{files}---\n")
    for split, rows in splits.items():
        datasets.Dataset.from_list(rows).to_parquet(str(folder / "main" / f"{split}-00000-of-00001.parquet"))
    return folder


def word_problems(n: int, rng: random.Random, exclude: set[str] = frozenset()) -> list[dict]:
    """Distinct one-step word problems (a + b) with GSM8K-style answers."""
    names, items = "Ana Ben Cy Dee Eli Fay Gus Ivy Jo Kai".split(), "apples books coins pens cards shells".split()
    problems, seen = [], set(exclude)
    while len(problems) < n:
        a, b, name, item = rng.randint(0, 9), rng.randint(0, 19), rng.choice(names), rng.choice(items)
        question = f"{name} has {a} {item} and gets {b} more. How many now?"
        if question not in seen:
            seen.add(question)
            problems.append({"question": question, "answer": f"{a} + {b} = {a + b}\n#### {a + b}"})
    return problems


@dataclass(frozen=True)
class Task:
    """Where a task's problems come from and what its prompt asks; every task is in GSM8K's format, scored as it."""
    instruction: str
    generated: bool = False      # word problems generated when no --dataset is given; else GSM8K

    def load(self, dataset: str, split: str):
        """A --dataset folder when given, else the task's generated problems ('train', 'test[:N]', ...): a fixed test
        set (a seed no choice of settings ever scored), and training problems never repeating it."""
        if dataset or not self.generated:
            return load_split(dataset, split)
        match = re.fullmatch(r"(\w+)(?:\[(\d*):(\d*)\])?", split)
        require(match, f"generated problems take a split like 'train', 'test[:10]' or 'train[5:]', not {split!r}")
        test = word_problems(200, random.Random("held-out test 1"))
        problems = test if match.group(1) == "test" else word_problems(
            2000, random.Random(101), exclude={p["question"] for p in test})
        return enough_rows(problems[int(match.group(2) or 0):int(match.group(3) or 0) or None], split)


class TaskDataset(GSM8KDataset):
    """GSM8KDataset over a run's task: its problems (--dataset, or generated), checked, numbered, in its prompt."""

    def __init__(self, split, tokenizer, max_length, *, dataset_path: str, prompt_style: str, task: Task):
        self.questions, self.answers, self.rows = checked_problems(task.load(dataset_path, split),
                                                                   f"{dataset_path} [{split}]")
        self.prompts = [build_prompt(q, tokenizer, prompt_style, task.instruction) for q in self.questions]
        self.tokenizer, self.max_length, self.prompt_style = tokenizer, max_length, prompt_style

    def __getitem__(self, idx):          # a Ctrl-C Python dropped (in a finalizer) is raised again, item by item
        check_ctrl_c()
        return super().__getitem__(idx)


HASH_INSTRUCTION = ("Solve the math word problem. Reason step by step, then give the final answer on its own "
                    "last line as '#### <number>'.")       # GSM8K's own form, for the generated task
# GSM8K, and word problems a small model can learn on a CPU in minutes
TASKS = {"gsm8k": Task(GSM8K_INSTRUCTION), "arithmetic": Task(HASH_INSTRUCTION, generated=True)}


# ----- The demo: a tiny Qwen2 model and an addition task, through the same pipeline on a CPU -----

# The demo's chat template keeps only the user's words: a 2-layer model cannot read the system instruction (the
# warm-up teaches it the answer format instead), and every prompt token is paid for on each of the 8 samples.
DEMO_CHAT_TEMPLATE = "{% for m in messages if m['role'] == 'user' %}{{ m['content'] }}\n{% endfor %}"


def build_byte_tokenizer(chat_template: str = DEMO_CHAT_TEMPLATE):
    """A byte-level BPE tokenizer (a reload as Qwen2Tokenizer keeps it) with Qwen's special tokens; pad is an EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], chat_template=chat_template)


def build_tiny_model(tokenizer, seed: int, hidden: int = 64, layers: int = 2):
    """A Qwen2ForCausalLM at toy size, with Qwen-like sampling defaults in its generation_config."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512, tie_word_embeddings=True,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id], pad_token_id=tokenizer.pad_token_id,
        do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.1)
    return model


@dataclass
class DemoConfig:
    train_problems: int = 2000    # generated training problems (GRPO draws prompts from these)
    test_problems: int = 300      # held-out problems for greedy accuracy
    hidden: int = 64              # model width
    layers: int = 2               # model depth
    warmup_lr: float = 3e-3       # supervised warm-up learning rate
    warmup_batch: int = 64        # supervised warm-up batch size
    warmup_max_steps: int = 1000  # supervised warm-up stops here at the latest
    warmup_target: float = 0.3    # ... or once greedy accuracy on 64 training problems reaches this


def demo_grpo_config(cfg: RunConfig) -> RunConfig:
    """The demo's GRPO settings, as its records were made (lr decays: no rate held on every seed); flags win."""
    return dataclasses.replace(cfg, prompt_style="chat", batch_size=16, group_size=8, max_new_tokens=8,
                               learning_rate=1e-3, lr_decay=True, lr_warmup_steps=0, max_steps=1000, num_epochs=10,
                               generation_batch_size=128, micro_batch_size=128, eval_batch_size=300, plot_every=100,
                               show_examples=5, device="cpu", dtype="float32", gradient_checkpointing="off",
                               eval_size=0, train_size=0, output_dir="runs/demo", loss_agg="seq-mean",
                               min_signal_groups=0, temperature=1.0)


def supervised_warmup(model, tokenizer, problems: list[dict], demo: DemoConfig, seed: int,
                      prompt_style: str = "plain") -> int:
    """Teach the answer format until `warmup_target` accuracy: a policy never right gives GRPO no signal."""
    prompts = [build_prompt(p["question"], tokenizer, prompt_style) for p in problems]
    targets = ["#### " + p["answer"].rsplit("####", 1)[1].strip() + tokenizer.eos_token for p in problems]
    optimizer = torch.optim.AdamW(model.parameters(), lr=demo.warmup_lr)
    probe = tokenizer.pad(tokenizer(prompts[:64]), padding_side="left", return_tensors="pt")
    probe_golds = [GSM8KDataset.extract_answer(p["answer"]) for p in problems[:64]]
    rng = random.Random(seed)
    for step in range(1, demo.warmup_max_steps + 1):
        check_ctrl_c()
        idx = rng.sample(range(len(problems)), demo.warmup_batch)
        prompt_ids = tokenizer([prompts[i] for i in idx])["input_ids"]
        target_ids = tokenizer([targets[i] for i in idx], add_special_tokens=False)["input_ids"]
        batch = tokenizer.pad({"input_ids": [p + t for p, t in zip(prompt_ids, target_ids)]}, padding_side="left",
                              return_tensors="pt")
        labels = batch["input_ids"].clone()
        for row, t in enumerate(target_ids):           # learn the answer only, not the question
            labels[row, : labels.shape[1] - len(t)] = -100
        model.train()
        loss = model(**batch, position_ids=(batch["attention_mask"].cumsum(-1) - 1).clamp(min=0), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            out = generate_completions(model, tokenizer, probe["input_ids"], probe["attention_mask"], 8, 0.0, 1)
            if compute_reward(out["completions"], probe_golds).mean().item() >= demo.warmup_target:   # greedy accuracy
                return step
    return demo.warmup_max_steps


def is_demo_run(run_dir: Path) -> bool:
    """RUN_DIR holds an earlier demo and nothing else, so a new demo may empty it."""
    marked = False
    with contextlib.suppress(OSError, ValueError, AttributeError):
        marked = json.loads(read_text(run_dir / "demo.json")).get("demo") is True
    return marked and not foreign_entries(run_dir, RUN_RECORD | {"demo.json", "demo_model", "demo_data"})


def run_demo(cfg: RunConfig, demo: DemoConfig = DemoConfig()) -> dict:
    """A tiny model and task (RUN_DIR/demo_model, demo_data), warmed up, saved and run through the real pipeline."""
    t0 = time.perf_counter()
    validate_config(cfg)
    with claimed_run_dir(Path(cfg.output_dir), resume=False, clearable=is_demo_run) as run_dir:
        try:
            write_json(run_dir / "demo.json", {"demo": True, "seed": cfg.seed})
            # the test problems: a stream no screening of the demo's settings scored
            test = word_problems(demo.test_problems, random.Random(f"held-out test {cfg.seed}"))
            train = word_problems(demo.train_problems, random.Random(cfg.seed), exclude={p["question"] for p in test})
            write_hub_dataset(run_dir / "demo_data", {"train": train, "test": test})
            tokenizer = build_byte_tokenizer()
            model = build_tiny_model(tokenizer, cfg.seed, demo.hidden, demo.layers)
            steps = supervised_warmup(model, tokenizer, train[: len(train) // 2], demo, cfg.seed, cfg.prompt_style)
            print(f"demo: tiny Qwen2 ({sum(p.numel() for p in model.parameters()):,} parameters) warmed up for "
                  f"{steps} supervised steps in {time.perf_counter() - t0:.0f}s")
            save_model(run_dir / "demo_model", model, tokenizer)
        except (KeyboardInterrupt, Exception) as e:      # a full disk in safetensors too: one line, its files gone
            for path in map(run_dir.joinpath, ("demo.json", "demo_data", "demo_model")):    # the demo's own only
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            raise UserError(f"interrupted while building the demo, {time.perf_counter() - t0:.0f} s in: run the same "
                            "command again to start it over" if isinstance(e, KeyboardInterrupt) else
                            f"failed while building the demo ({first_line(e)}); nothing was kept") from None
        model_path, dataset = (absolute_if_local(str(run_dir / name)) for name in ("demo_model", "demo_data"))
        summary = run_phases(dataclasses.replace(cfg, model_path=model_path, dataset=dataset), run_dir, resume=False)
        summary.update(demo_warmup_steps=steps, demo_total_seconds=time.perf_counter() - t0)
        write_json(run_dir / "summary.json", summary)
    print(f"demo: accuracy {summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%} "
          f"in {summary['demo_total_seconds']:.0f}s")
    return summary


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)    # from here on, main() handles Ctrl-C
    sys.exit(main())
