"""cmp.py A.json B.json -> first record that differs"""
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def first(a, b):
    if a["eval_before"] != b["eval_before"]: return "eval_before"
    for i, (x, y) in enumerate(zip(a["steps"] or [], b["steps"] or [])):
        if x != y:
            ks = [k for k in x if x[k] != y[k]]
            return f"step{i+1} ({','.join(ks)})"
    if len(a["steps"] or []) != len(b["steps"] or []): return "steps count"
    if a["eval_after"] != b["eval_after"]: return "eval_after"
    if a["final"] != b["final"]: return "final weights"
    return "SAME"
print(first(a, b))
