"""Run under `torchrun --nproc_per_node=2` by test_torchrun.py; not a test module itself.

update OUT: one grpo_update on fixed rollouts (4 prompts x group 4), each process holding two groups;
    rank 0's second group and both of rank 1's have no reward spread, so rank 0 leaves one group out of the
    update and rank 1 runs zero-advantage rows to keep in step; rank 0 saves the weights after an SGD step of
    lr 1 (so weights moved by exactly minus the averaged gradient) for each loss reduction, and under LoRA.
desync OUT: perturb rank 1's weights and check that check_replicas notices; an out-of-memory error is not
    retried at a smaller size under torchrun (processes would fall out of step) but reported.
"""
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo_homework as gh  # noqa: E402

GROUP = 4


def fixed_rollout(tokenizer) -> gh.Rollout:
    """Four prompts (two left-padded) x 4 completions of different lengths, fixed rewards; one group has spread."""
    g = torch.Generator().manual_seed(0)
    rows, prompt_len, new = 4 * GROUP, 5, 6
    ids = torch.randint(3, len(tokenizer), (rows, prompt_len + new), generator=g)
    attention = torch.ones_like(ids)
    for shorter in (slice(GROUP, 2 * GROUP), slice(3 * GROUP, 4 * GROUP)):
        attention[shorter, :2] = 0
        ids[shorter, :2] = tokenizer.pad_token_id
    lengths = torch.tensor([6, 2, 4, 1, 3, 6, 5, 2, 1, 6, 3, 4, 2, 5, 6, 3])
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    for r, n in enumerate(lengths.tolist()):
        loss_mask[r, prompt_len:prompt_len + n] = True
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0] + [0.0] * 4 + [1.0] * 4 + [0.0] * 4)
    return gh.Rollout(ids, attention, loss_mask, prompt_len, [""] * rows, rewards,
                      gh.compute_advantages_grpo(rewards, GROUP), torch.zeros(rows, dtype=torch.bool), lengths)


def take_rows(rollout: gh.Rollout, rows: slice) -> gh.Rollout:
    return gh.Rollout(rollout.output_ids[rows], rollout.attention_mask[rows], rollout.loss_mask[rows],
                      rollout.prompt_length, rollout.completions[rows], rollout.rewards[rows],
                      rollout.advantages[rows], rollout.truncated[rows], rollout.completion_lengths[rows])


def tiny_policy():
    """The shared start: the same tokenizer and weights in every process."""
    tokenizer = gh.build_byte_tokenizer()
    return tokenizer, gh.build_tiny_model(tokenizer, seed=0, hidden=32, layers=2)


def update_once(loss_agg: str, rows: slice | None = None, silent: bool = False, lora: bool = False) -> dict:
    """Weights after one step from the shared start, on all rows (one process) or on this rank's rows; with
    `lora`, the adapters' (rank 4 in every linear layer) after a step that trains only them.

    silent: no group has reward spread on any process, so no process runs a pass or an optimizer step: AdamW (lr
    0.1, weight decay 0.1), which would move every weight by its decay, leaves them all as they were."""
    tokenizer, model = tiny_policy()
    cfg = gh.Config(loss_agg=loss_agg, micro_batch_size=3, max_new_tokens=6, max_grad_norm=1e9,
                    lora_rank=4 if lora else 0)
    if lora:
        model = gh.with_lora(model, cfg, None)
    scorer = gh.wrap_for_processes(gh.PolicyLogprobs(model), torch.device("cpu"))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    rollout = fixed_rollout(tokenizer)
    if silent:
        rollout.advantages.zero_()
        optimizer = gh.build_optimizer(model.parameters(), lr=0.1)
        optimizer.param_groups[0]["weight_decay"] = 0.1
    gh.grpo_update(model, optimizer, take_rows(rollout, rows) if rows else rollout, cfg, scorer=scorer)
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad or not lora}


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    gh.init_distributed("cpu")
    rank, world = gh.world()
    assert world == 2
    if mode == "update":
        mine = slice(rank * 2 * GROUP, (rank + 1) * 2 * GROUP)
        result = {agg: update_once(agg, mine) for agg in ("seq-mean", "token-mean")}
        result["silent"] = update_once("seq-mean", mine, silent=True)
        if importlib.util.find_spec("peft"):          # optional, as for users: the LoRA check skips without it
            result["lora"] = update_once("seq-mean", mine, lora=True)
        if rank == 0:
            torch.save(result, out)
    elif mode == "desync":
        _, model = tiny_policy()
        gh.check_replicas(model, 0)                                   # identical: passes
        if rank == 1:
            with torch.no_grad():
                next(model.parameters())[0, 0] += 1e-3
        try:
            gh.check_replicas(model, 1)
        except gh.UserError as e:
            if rank == 0:
                out.write_text(str(e) + "\n")

        def out_of_memory():
            raise torch.OutOfMemoryError("CUDA out of memory")
        try:
            gh.halve_on_oom(gh.Config(micro_batch_size=8), "micro_batch_size", out_of_memory)
        except gh.OutOfMemory as e:
            if rank == 0:
                out.write_text(out.read_text() + str(e) + " | resume with" + e.resume_flags)
    gh.dist.barrier()
    gh.dist.destroy_process_group()
