#!/usr/bin/env bash
# #59 item 2's pilots, then the free control at both budgets ("Be concise." added to the instruction, no training),
# in sequence, on the validation split (first 100 of the 200 held-out train problems), in bf16. Code: grpo_homework.py
# at a846f0a. The 256 pilot ran from this list before the control lines were added (then named driver.sh; the
# list with them was driver2.sh); re-running skips what finished and resumes what stopped.
set -u
cd /work/runs/pilots
MODEL=/work/models/qwen2.5-coder-0.5b-instruct
COMMON="--dataset /work/shared/gsm8k --device cpu --dtype bfloat16 --val-size 200 --eval-split validation
  --eval-size 100 --eval-batch-size 50 --batch-size 4 --group-size 8 --max-draws 2 --temperature 0.7
  --lr-warmup-steps 0 --max-steps 12 --generation-batch-size 32 --micro-batch-size 4 --save-every 2
  --keep-checkpoints 1 --plot-every 1 --show-examples 0 --seed 0"
run() {  # name, then its own flags
  local name=$1; shift
  if [ -f "$name/summary.json" ] && grep -q '"finished": true' "$name/summary.json"; then return; fi
  if [ -d "$name" ]; then python grpo_homework.py --resume "$name" >> "$name.log" 2>&1
  else python grpo_homework.py $MODEL $COMMON --output-dir "$name" "$@" >> "$name.log" 2>&1; fi
}
control() {  # budget
  [ -f "control-$1.json" ] && grep -q 'seconds_per_problem' "control-$1.json" && return
  python /work/main/tests/bench_prompt.py $MODEL --dataset /work/shared/gsm8k --split train --problems 100 \
    --groups 0 --instructions boxed-concise --eval-batch-size 50 --max-new-tokens $1 --dtype bfloat16 \
    --out control-$1.json >> control-$1.log 2>&1
}
run b256-full-lr2e-6 --max-new-tokens 256 --learning-rate 2e-6
run b192-full-lr2e-6 --max-new-tokens 192 --learning-rate 2e-6
control 256
control 192
