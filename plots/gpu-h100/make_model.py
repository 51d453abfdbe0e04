"""A model folder of Qwen2.5-1.5B-Instruct's shape with random weights (bf16, seed 0; real weights cannot travel to
the lent GPU), with Qwen2.5's tokenizer, chat template and generation config copied from a Qwen2.5 folder, so the
CLI loads it as it loads the real model. Usage: make_model.py DEST TOKENIZER_DIR [--layers N --hidden-size H]."""
import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from bench_gpu import QWEN25_15B, build_model  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("dest", type=Path)
parser.add_argument("tokenizer_dir", type=Path)
parser.add_argument("--layers", type=int, default=QWEN25_15B["num_hidden_layers"])
parser.add_argument("--hidden-size", type=int, default=QWEN25_15B["hidden_size"])
args = parser.parse_args()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = build_model(args.layers, device, args.hidden_size).to(torch.bfloat16)
model.save_pretrained(args.dest)
for f in args.tokenizer_dir.iterdir():          # the generation config too: Qwen2.5's EOS ids and sampling defaults
    shutil.copy(f, args.dest / f.name)
print(f"{args.dest}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, bf16")
