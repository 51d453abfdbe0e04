"""LoRA through peft (--lora-rank): checkpoints hold the adapters, final/ loads without peft, resume is bit-exact in
the GPU job's precision, peft is imported only when asked for, and what cannot work is refused in one line."""
import ast

import pytest
import torch
from safetensors.torch import load_file

import grpo_homework as gh
from conftest import ROOT, update_once
from test_cli import GPU_PRECISION, tiny_args

pytest.importorskip("peft")
LORA = ["--lora-rank", "4", "--lora-alpha", "8"]


def varied(completions, golds, **kwargs):
    """A reward that varies with the text, so that every step has groups with spread and the adapters train."""
    return torch.tensor([float(sum(map(ord, c)) % 2) for c in completions])


@pytest.fixture(scope="module")
def lora_run(warm_model_dir, addition_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gh, "compute_reward", varied)
        assert gh.main(tiny_args(warm_model_dir, addition_dir, out, "--max-steps", "2", "--save-every", "1",
                                 "--prompt-style", "plain", "--batch-size", "4", "--learning-rate", "1e-2",
                                 *LORA)) == 0
    return out


def test_checkpoints_hold_the_adapters_and_their_optimizer_state_only(lora_run, warm_model_dir):
    checkpoint = lora_run / "checkpoints" / "step-2"
    assert (checkpoint / "adapter_model.safetensors").exists() and not (checkpoint / "model.safetensors").exists()
    import json
    import peft
    assert json.loads((lora_run / "config.json").read_text())["versions"]["peft"] == peft.__version__
    adapters = load_file(checkpoint / "adapter_model.safetensors")
    assert adapters and all("lora_A" in k or "lora_B" in k for k in adapters)
    assert not any("lm_head" in k or "embed" in k for k in adapters)             # all-linear: the body's layers
    state = gh.load_trainer_state(checkpoint)
    moments = [v["exp_avg"] for _, v in state["optimizer"]["state"].items()]
    assert sorted(m.numel() for m in moments) == sorted(t.numel() for t in adapters.values())
    full = sum(t.numel() for t in load_file(warm_model_dir / "model.safetensors").values())
    assert sum(t.numel() for t in adapters.values()) < full / 10


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")    # peft's own, when it loads
def test_final_loads_without_peft_as_the_base_with_the_adapters_merged_in(lora_run, warm_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    merged = AutoModelForCausalLM.from_pretrained(lora_run / "final")
    assert type(merged).__name__ == "Qwen2ForCausalLM" and not any("lora" in k for k in merged.state_dict())
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(warm_model_dir),
                                             lora_run / "final" / "adapter")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, with_adapter(ids).logits, rtol=1e-5, atol=1e-5)
        base = AutoModelForCausalLM.from_pretrained(warm_model_dir)(ids).logits
    assert not torch.allclose(merged(ids).logits, base, atol=1e-6), "the adapters trained"


def test_a_lora_resume_ends_bit_identical_in_bf16_and_refuses_another_rank(warm_model_dir, addition_dir, tmp_path,
                                                                           capsys, monkeypatch):
    monkeypatch.setattr(gh, "compute_reward", varied)
    whole, split = tmp_path / "whole", tmp_path / "split"
    args = ["--prompt-style", "plain", "--train-size", "0", "--batch-size", "4", "--learning-rate", "1e-2",
            *GPU_PRECISION, *LORA]
    assert gh.main(tiny_args(warm_model_dir, addition_dir, whole, "--max-steps", "4", *args)) == 0
    assert gh.main(tiny_args(warm_model_dir, addition_dir, split, "--max-steps", "2", "--save-every", "2",
                             *args)) == 0
    assert gh.main(["--resume", str(split), "--max-steps", "3", "--lora-rank", "8"]) == 2
    assert "--resume cannot change --lora-rank" in capsys.readouterr().err
    assert gh.main(["--resume", str(split), "--max-steps", "4"]) == 0
    a, b = (load_file(run / "final" / "adapter" / "adapter_model.safetensors") for run in (whole, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(t.dtype == torch.float32 for t in a.values())       # fp32 adapters beside the bf16 weights
    start = load_file(warm_model_dir / "model.safetensors")
    assert any(not torch.equal(t, torch.zeros_like(t)) for k, t in a.items() if "lora_B" in k) and start


@pytest.mark.parametrize("flags, message", [
    (["--lora-rank", "-1"], "--lora-rank must not be negative"),
    (["--lora-rank", "4", "--lora-alpha", "0"], "--lora-alpha must be positive"),
    (["--lora-rank", "4", "--lora-targets", "no_such_layer"], "no_such_layer"),
    # the LM head is read as a weight (its adapter would never train), the embedding is tied to it, a typo
    # would leave the others adapted in silence: each is refused, naming the layers that can take adapters
    (["--lora-rank", "4", "--lora-targets", "embed_tokens"], "'embed_tokens' is not among the body's linear layers"),
    (["--lora-rank", "4", "--lora-targets", "q_proj,lm_head"], "'lm_head' is not among"),
    (["--lora-rank", "4", "--lora-targets", "lm_head"], "'lm_head' is not among"),
    (["--lora-rank", "4", "--lora-targets", "q_proj,vproj"], "'vproj' is not among the body's linear layers, which "
                                                             "take adapters here: down_proj,gate_proj,k_proj,o_proj")])
def test_lora_flags_that_cannot_work_are_one_line(model_dir, gsm8k_dir, tmp_path, capsys, flags, message):
    assert gh.main(tiny_args(model_dir, gsm8k_dir, tmp_path / "run", *flags)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "".join(err)


def test_without_peft_lora_is_refused_naming_the_install(model_dir, gsm8k_dir, tmp_path, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    assert gh.main(tiny_args(model_dir, gsm8k_dir, tmp_path / "run", *LORA)) == 2
    assert "--lora-rank needs peft, which is not installed: pip install peft" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_peft_is_imported_only_inside_with_lora():
    tree = ast.parse((ROOT / "grpo_homework.py").read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and "peft" in ast.unparse(node):
            owner = node
            while not isinstance(owner, ast.FunctionDef):
                owner = parents[owner]
            assert owner.name == "with_lora"


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")    # peft's own, when it loads
def test_lora_in_bf16_final_is_the_model_that_was_trained_and_scored(warm_model_dir, addition_dir, tmp_path,
                                                                     monkeypatch):
    """At lr 1e-5 (README's LoRA rate) an adapter's update is far below half a bf16 step of the weight it adds to: a
    merge into bf16 weights kept 25% of the log-prob change that training made. Compared in fp32 on a batch: the
    trained model (the bf16 base with the fp32 adapters, unmerged, as the after-evaluation scored it) and final/."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    monkeypatch.setattr(gh, "compute_reward", varied)
    out = tmp_path / "run"
    assert gh.main(tiny_args(warm_model_dir, addition_dir, out, "--max-steps", "4", "--prompt-style", "plain",
                             "--batch-size", "4", "--learning-rate", "1e-5", "--dtype", "bfloat16", *LORA)) == 0
    base = lambda: AutoModelForCausalLM.from_pretrained(warm_model_dir, dtype=torch.bfloat16).float()
    trained = PeftModel.from_pretrained(base(), out / "final" / "adapter")
    final = AutoModelForCausalLM.from_pretrained(out / "final", dtype="auto")
    assert final.dtype == torch.float32
    ids = torch.randint(3, 200, (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logprobs = [m(ids).logits.log_softmax(-1) for m in (base(), trained, final.float())]
    change, difference = (logprobs[1] - logprobs[0]).abs().max(), (logprobs[2] - logprobs[1]).abs().max()
    assert change > 1e-5, "the adapters must move the model, or nothing is tested"
    assert difference <= 0.01 * change, (difference, change)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")    # peft's own, when it loads
def test_under_lora_the_kl_reference_is_the_model_with_its_adapters_off(model_dir, gsm8k_dir, tmp_path,
                                                                        monkeypatch):
    """--kl-coef under LoRA loads no copy of the starting model (2.9 GiB at 1.5B): the reference is the model itself
    with its adapters switched off, so the KL equals the one to a separately loaded starting model; the adapted
    model against itself would give 0. The adapters are on again after it."""
    from test_grpo import _rollout_of
    cpu, cfg = torch.device("cpu"), gh.RunConfig(lora_rank=4, lora_alpha=8, group_size=4, max_new_tokens=6,
                                              kl_coef=0.1, max_grad_norm=1e9)
    starting, tok = gh.load_model_and_tokenizer(str(model_dir), cpu, "float32")
    model = gh.with_lora(gh.load_model_and_tokenizer(str(model_dir), cpu, "float32")[0], cfg, None)
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:                 # peft starts B at 0 (adapters that change nothing): move them
            p.data.normal_(0, 0.5)
    rollout = _rollout_of(model, tok, cfg, ["1 + 2 =", "3 + 4 ="])
    frozen = lambda: torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    own = update_once(model, frozen(), rollout, cfg, ref_model=model)["kl_ref"]
    copy = update_once(model, frozen(), rollout, cfg, ref_model=starting)["kl_ref"]
    assert own > 1e-4 and own == pytest.approx(copy, rel=1e-5), (own, copy)
    lp = lambda m: gh.compute_logprobs_from_model(m, rollout.output_ids, rollout.attention_mask)
    assert not torch.allclose(lp(model), lp(starting), atol=1e-3)                    # the adapters are back on
    loads, real = [], gh.load_model_and_tokenizer
    monkeypatch.setattr(gh, "load_model_and_tokenizer", lambda path, *a: loads.append(path) or real(path, *a))
    assert gh.main(tiny_args(model_dir, gsm8k_dir, tmp_path / "run", "--max-steps", "1", "--kl-coef", "0.1",
                             *LORA)) == 0
    assert len(loads) == 1, loads                                                    # the policy only


def test_lora_targets_with_spaces_adapt_every_layer_named(model_dir, gsm8k_dir, tmp_path):
    out = tmp_path / "run"
    assert gh.main(tiny_args(model_dir, gsm8k_dir, out, "--max-steps", "1", "--save-every", "1", *LORA,
                             "--lora-targets", "q_proj, v_proj")) == 0
    adapted = {k.split(".")[-3] for k in load_file(out / "checkpoints" / "step-1" / "adapter_model.safetensors")}
    assert adapted == {"q_proj", "v_proj"}


@pytest.mark.parametrize("lost", ["adapter_config.json", "adapter_model.safetensors"])
def test_a_damaged_lora_checkpoint_is_named_not_a_flag(lora_run, tmp_path, capsys, lost):
    import shutil
    run = shutil.copytree(lora_run, tmp_path / "run")
    shutil.rmtree(run / "checkpoints" / "step-2")
    (run / "checkpoints" / "step-1" / lost).unlink()
    assert gh.main(["--resume", str(run)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"cannot read the adapters of checkpoint {run / 'checkpoints' / 'step-1'}" in last, last
    assert "--lora-targets" not in last
