"""digest.py RUN -> JSON: eval_before/eval_after (completion, correct per problem), each metrics step's
value-bearing fields (those ee633bf records, timings dropped), final weights hashed tensor by tensor."""
import hashlib, json, sys
from pathlib import Path
KEYS = ["step", "batch_in_epoch", "samples", "prompts_drawn", "signal_groups", "reward_mean", "reward_std",
        "zero_spread_frac", "loss", "clipfrac", "approx_kl", "policy_kl", "grad_norm", "skipped", "entropy",
        "completion_len_mean", "completion_len_max", "truncated_frac", "lr"]
run = Path(sys.argv[1])
out = {}
def ev(name):
    p = run / name
    if not p.exists(): return None
    return [(r["completion"], r["correct"]) for r in map(json.loads, p.read_text().splitlines())]
out["eval_before"] = ev("eval_before.jsonl")
out["steps"] = [{k: r.get(k) for k in KEYS} for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] \
    if (run / "metrics.jsonl").exists() else None
out["eval_after"] = ev("eval_after.jsonl")
from safetensors.torch import load_file
w = sorted((run / "final").glob("*.safetensors"))
if w:
    d = {}
    for x in w: d.update(load_file(x))
    hh = hashlib.sha256()
    for k in sorted(d): hh.update(k.encode()); hh.update(d[k].float().numpy().tobytes())
    out["final"] = hh.hexdigest()[:12]
else:
    out["final"] = None
print(json.dumps(out))
