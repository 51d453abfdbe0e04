"""Import grpo_homework.py from the ee633bf, 40be262 and HEAD worktrees and compare the five TODO functions'
arithmetic on the same inputs. Prints max |difference| vs ee633bf per function and case."""
import importlib.util, sys, random
import torch
sys.argv = ["x"]
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m
V = {"ee633bf": load("gh_ee", "/tmp/wt-ee/grpo_homework.py"),
     "40be262": load("gh_40", "/tmp/wt-40/grpo_homework.py"),
     "HEAD": load("gh_head", "/tmp/wt-head/grpo_homework.py")}
def diff(a, b):
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape: return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
        return f"{(a.double() - b.double()).abs().max().item():.3g}" + ("" if a.dtype == b.dtype else f" (dtype {a.dtype} vs {b.dtype})")
    return "equal" if a == b else f"DIFF {a!r} vs {b!r}"
def report(title, f):
    res = {k: f(m) for k, m in V.items()}
    base = res["ee633bf"]
    print(f"{title:60s} 40be262: {diff(base, res['40be262'])}   HEAD: {diff(base, res['HEAD'])}")

g = torch.Generator().manual_seed(0)
# TODO 2
r01 = (torch.rand(64, generator=g) < 0.3).float()
rfrac = torch.rand(64, generator=g)
for name, r in [("0/1 rewards", r01), ("fractional rewards", rfrac)]:
    for norm in (True, False):
        report(f"TODO2 advantages {name} std={norm}", lambda m: m.compute_advantages_grpo(r.clone(), 8, normalize_by_std=norm))
report("TODO2 advantages fp64 rewards", lambda m: m.compute_advantages_grpo(rfrac.double(), 8))
# TODO 3
B, S = 8, 20
lp = -torch.rand(B, S, generator=g) * 3; old = lp + torch.randn(B, S, generator=g) * 0.3
adv = torch.randn(B, generator=g); mask = torch.zeros(B, S); 
for i in range(B): mask[i, 5:5 + 3 + i] = 1
for agg in ("seq-mean", "drgrpo"):
    for dt in (torch.float32, torch.bfloat16):
        def loss(m, agg=agg, dt=dt, grad=False):
            x = lp.to(dt).clone().requires_grad_(True)
            out = m.compute_policy_loss(x, old.to(dt), adv, mask, 0.2, loss_agg=agg, num_tokens=16)
            if grad:
                out.backward(); return x.grad
            return out.detach()
        report(f"TODO3 loss {agg} {dt}", loss)
        report(f"TODO3 d loss/d logprobs {agg} {dt}", lambda m: loss(m, grad=True))
    report(f"TODO3 loss {agg} ratio 1 (old = lp)", lambda m, agg=agg: m.compute_policy_loss(lp, lp, adv, mask, 0.2, loss_agg=agg, num_tokens=16))
# TODO 4
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("/tmp/oldcode/inputs/model")
for dt in (torch.float32, torch.bfloat16):
    model = AutoModelForCausalLM.from_pretrained("/tmp/oldcode/inputs/model", dtype=dt)
    ids = torch.randint(3, 200, (6, 30), generator=g); am = torch.ones_like(ids); am[0, :4] = 0; am[3, :2] = 0
    ids[am == 0] = tok.pad_token_id
    def lps(m, grad=False):
        model.zero_grad()
        out = m.compute_logprobs_from_model(model, ids, am, temperature=0.7, prompt_length=12)
        if grad:
            (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()
            return torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
        return out.detach()
    report(f"TODO4 logprobs {dt}", lps)
    report(f"TODO4 weight gradient {dt}", lambda m: lps(m, True))
# TODO 1
for style in ("plain", "chat"):
    def items(m, style=style):
        ds = m.GSM8KDataset("train", tok, 512, dataset_path="/tmp/oldcode/inputs/data", prompt_style=style)
        return [(d["input_ids"].tolist(), d["attention_mask"].tolist(), d["prompt"], d["answer"]) for d in ds]
    report(f"TODO1 tokenized items ({style}, 64 problems)", items)
def short(m):   # max_length smaller than the prompts
    ds = m.GSM8KDataset("train", tok, 40, dataset_path="/tmp/oldcode/inputs/data", prompt_style="plain")
    return (len(ds), ds[0]["input_ids"].tolist() if len(ds) else None)
try: report("TODO1 max_length 40 (prompts longer): (len, item 0)", short)
except Exception as e: print("TODO1 short:", e)
# TODO 5 reward
comps = ["#### 19", "so 6+13=19\n#### 19", "The answer is 19.", "\\boxed{19}", "#### 19.0000001", "#### 18.9999999",
         "#### 1,234", "19", "#### 20", "answer is 19 then #### 20", "#### 9007199254740993", "#### -5", "$19", "####19kg",
         "#### 3/4", "#### 0.5", "\\boxed{0.50}", "#### 1e3", ""]
golds = [19, 19, 19, 19, 19, 19, 1234, 19, 19, 19, 9007199254740993, -5, 19, 19, 0.75, 0.5, 0.5, 1000, 19]
report("TODO5 compute_reward (19 cases)", lambda m: m.compute_reward(comps, golds))
for c, gd in zip(comps, golds):
    vals = {k: m.compute_reward([c], [gd]).item() for k, m in V.items()}
    if len(set(vals.values())) > 1: print(f"   reward differs on {c!r} gold {gd}: {vals}")
# the run's actual step-1 style: random completions of the tiny model are scored the same? (checked in runs)
# TODO 4 on GRPO-shaped rows (one prompt, left-padded, shared by 4 samples: ee633bf's grouped prompt pass runs) and
# the gradient's difference relative to its largest entry
for dt in (torch.float32, torch.bfloat16):
    model = AutoModelForCausalLM.from_pretrained("/tmp/oldcode/inputs/model", dtype=dt)
    prompt = torch.randint(3, 200, (2, 12), generator=g); pm = torch.ones_like(prompt); pm[1, :3] = 0
    prompt[pm == 0] = tok.pad_token_id
    ids = torch.cat([prompt.repeat_interleave(4, 0), torch.randint(3, 200, (8, 10), generator=g)], 1)
    am = torch.cat([pm.repeat_interleave(4, 0), torch.ones(8, 10, dtype=torch.long)], 1)
    res = {}
    for k, m in V.items():
        model.zero_grad()
        out = m.compute_logprobs_from_model(model, ids, am, temperature=0.7, prompt_length=12)
        (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()
        res[k] = (out.detach(), torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None]))
    for k in ("40be262", "HEAD"):
        dl = (res[k][0] - res["ee633bf"][0]).abs().max().item()
        dg = (res[k][1] - res["ee633bf"][1]).abs().max().item() / res["ee633bf"][1].abs().max().item()
        print(f"TODO4 grouped rows {dt}: {k} vs ee633bf  logprobs max|d| {dl:.3g}, gradient max|d|/max|g| {dg:.3g}")
    dl = (res["HEAD"][0] - res["40be262"][0]).abs().max().item(); dg = (res["HEAD"][1] - res["40be262"][1]).abs().max().item()
    print(f"TODO4 grouped rows {dt}: HEAD vs 40be262  logprobs max|d| {dl:.3g}, gradient max|d| {dg:.3g}")
