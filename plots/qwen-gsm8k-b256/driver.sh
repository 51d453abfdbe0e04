#!/usr/bin/env bash
# #59 item 3: the run. Settings from the pilots (plots/qwen-bf16-pilots/): full fine-tuning in bf16, lr 2e-6 constant,
# 4 prompts x 8 completions filled to 4 groups with spread from up to 2 more draws, T 0.7, drgrpo loss, 256 new tokens
# for training and for both evaluations (first 200 GSM8K test problems, greedy); the first 200 train problems held out.
# Then both models scored at 512 tokens on the same 200 problems with --eval-only. Re-running resumes where it stopped.
set -u
cd /work/runs/qwen-gsm8k-b256
MODEL=/work/models/qwen2.5-coder-0.5b-instruct
if ! { [ -f run/summary.json ] && grep -q '"finished": true' run/summary.json; }; then
  if [ -d run ]; then python grpo_homework.py --resume run >> run.log 2>&1
  else python grpo_homework.py $MODEL --dataset /work/shared/gsm8k --device cpu --dtype bfloat16 \
    --val-size 200 --eval-split test --eval-size 200 --eval-batch-size 50 --max-new-tokens 256 \
    --batch-size 4 --group-size 8 --max-draws 2 --temperature 0.7 --learning-rate 2e-6 --lr-warmup-steps 0 \
    --max-steps 32 --generation-batch-size 32 --micro-batch-size 4 --save-every 2 --keep-checkpoints 1 \
    --plot-every 1 --seed 0 --output-dir run >> run.log 2>&1; fi
  grep -q '"finished": true' run/summary.json || exit 1
fi
for who in before after; do
  model=$MODEL; [ $who = after ] && model=run/final
  [ -f eval512-$who/summary.json ] && grep -q '"finished": true' eval512-$who/summary.json && continue
  rm -rf eval512-$who  # an evaluation cut short has no checkpoint to resume: score it again
  python grpo_homework.py $model --eval-only --dataset /work/shared/gsm8k --device cpu --dtype bfloat16 \
    --val-size 200 --eval-split test --eval-size 200 --eval-batch-size 50 --max-new-tokens 512 --seed 0 \
    --output-dir eval512-$who >> eval512-$who.log 2>&1
done
