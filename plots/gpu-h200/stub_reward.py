#!/usr/bin/env python3
"""Dry run only (dry_run.sh): grpo_homework.py's own CLI with a stand-in reward, 1 for a completion whose character
codes sum to an odd number: a tiny random model never answers GSM8K, so with the real reward every group's rewards
are equal and no update runs; this one gives groups spread, so the dry run's steps update the weights and its
checkpoints hold AdamW's moments, as the real run's do. (The same stub as ../shared/gpu-runs/h200-2026-11-28/cli.py.)
"""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.environ.get("HOMEWORK_DIR") or str(Path(__file__).resolve().parents[2]))   # the dry run: a
#                                                                         snapshot of grpo_homework.py at HEAD
import grpo_homework as gh  # noqa: E402

gh.compute_reward = lambda completions, golds, **kw: torch.tensor([float(sum(map(ord, c)) % 2) for c in completions])
sys.exit(gh.main(sys.argv[1:]))
