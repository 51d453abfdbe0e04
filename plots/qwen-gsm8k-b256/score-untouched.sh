#!/usr/bin/env bash
# #64: both models at 256 and 512 new tokens on GSM8K test problems 200-1318 (plan.md beside this file), greedy,
# bf16, from a copy of grpo_homework.py at the plan's commit. Runs after the re-run's training has finished.
# Re-running skips what finished; an interrupted --eval-only resumes from its own folder.
set -u
WORK=/work/runs/qwen-gsm8k-b256-untouched
MODEL=/work/models/qwen2.5-coder-0.5b-instruct
TRAINED=/work/runs/qwen-cpu-rerun/runs/qwen-cpu/final
mkdir -p $WORK && cd $WORK
[ -f grpo_homework.py ] || git -C /work/main show 6d00ef5:grpo_homework.py > grpo_homework.py
grep -q '"finished": true' /work/runs/qwen-cpu-rerun/runs/qwen-cpu/summary.json || { echo "the re-run has not finished"; exit 1; }
for tokens in 256 512; do
  for who in before after; do
    model=$MODEL; [ $who = after ] && model=$TRAINED
    out=$who-$tokens
    [ -f $out/summary.json ] && grep -q '"finished": true' $out/summary.json && continue
    if [ -d $out ]; then python grpo_homework.py --resume $out >> $out.log 2>&1
    else python grpo_homework.py $model --eval-only --dataset /work/shared/gsm8k --device cpu --dtype bfloat16 \
      --eval-split test --eval-start 200 --eval-size 0 --eval-batch-size 50 --max-new-tokens $tokens --seed 0 \
      --output-dir $out >> $out.log 2>&1; fi
    grep -q '"finished": true' $out/summary.json || exit 1
  done
done
