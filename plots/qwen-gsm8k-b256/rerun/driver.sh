#!/usr/bin/env bash
# #64 item 3: README's CPU command, as it reads at commit ee633bf, from a copy of grpo_homework.py at that commit,
# on a machine laid anew (the 0.5B run's final/ did not survive). Re-running resumes where it stopped.
set -u
cd /work/runs/qwen-cpu-rerun
if [ -d runs/qwen-cpu ]; then python grpo_homework.py --resume runs/qwen-cpu >> run.log 2>&1
else python grpo_homework.py Qwen2.5-Coder-0.5B-Instruct --device cpu --dtype bfloat16 --val-size 200 --eval-size 200 \
    --eval-batch-size 50 --group-size 8 --max-draws 2 --lr-warmup-steps 0 --max-steps 32 \
    --generation-batch-size 32 --save-every 2 --keep-checkpoints 1 --output-dir runs/qwen-cpu >> run.log 2>&1; fi
