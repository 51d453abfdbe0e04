"""Runs a script (grpo_homework.py's CLI) with PyTorch's allocator capped at CAP_GIB GiB of the card, for this
process only: a smaller card on a large one, so out of memory happens on a real GPU where the check wants it.
Usage: CAP_GIB=7.3 python capped.py grpo_homework.py ARGS... (on a CPU the cap is skipped: a smoke test)."""
import os
import runpy
import sys

import torch

if torch.cuda.is_available():
    cap = float(os.environ["CAP_GIB"]) * 2**30
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)
    print(f"allocator capped at {os.environ['CAP_GIB']} GiB of {torch.cuda.get_device_name()}", flush=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
