#!/usr/bin/env python3
"""Two model folders hold the same model: every tensor bit for bit (across any sharding), and the same config,
generation config and tokenizer files. Exit 1 on any difference.

    python plots/gpu-h200/same_model.py FOLDER_A FOLDER_B
"""
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def tensors(folder: Path) -> dict:
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def main(a: str, b: str) -> int:
    fa, fb = Path(a), Path(b)
    ta, tb = tensors(fa), tensors(fb)
    bad = sorted(set(ta) ^ set(tb)) + sorted(k for k in set(ta) & set(tb) if ta[k].dtype != tb[k].dtype or
                                             ta[k].shape != tb[k].shape or not torch.equal(ta[k], tb[k]))
    files = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    bad += [f for f in files if (fa / f).read_bytes() != (fb / f).read_bytes()]
    dtypes = sorted({str(t.dtype) for t in ta.values()})
    print(f"{a} vs {b}: {len(ta)} tensors ({sum(t.numel() for t in ta.values()):,} values, {', '.join(dtypes)}), "
          f"{len(files)} files: " + (f"DIFFERENT: {bad[:8]}" if bad else "identical"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
