#!/usr/bin/env bash
# #67 items 2-3 on Qwen2.5-Coder-1.5B-Instruct (tests/build_qwen_coder.py --size 1.5b), bf16, 2 CPU cores, alone:
# the scorer-vs-sampler measurement, then the pilots of notes.md in its order, then each pilot's final/ scored at 512,
# then the free control. Code: grpo_homework.py copied once, at the first start (its commit in code-commit.txt),
# so a later edit cannot change the pilots. Re-running skips what finished and resumes what stopped; each step
# checkpoints (LoRA's are small).
set -u
WORK=/work/runs/qwen15-pilots
MODEL=/work/models/qwen2.5-coder-1.5b-instruct
GSM8K=/work/shared/gsm8k
mkdir -p $WORK && cd $WORK
[ -f grpo_homework.py ] || { git -C /work/main rev-parse HEAD > code-commit.txt
  git -C /work/main show HEAD:grpo_homework.py > grpo_homework.py; }
[ -f scorer.txt ] || { /usr/bin/time -v python /work/main/tests/bench_scorer.py $MODEL --dataset $GSM8K \
  > scorer.partial 2>&1 && mv scorer.partial scorer.txt; } || exit 1     # a stopped measurement is redone whole
COMMON="--dataset $GSM8K --device cpu --dtype bfloat16 --val-size 200 --eval-split validation --eval-size 100
  --eval-batch-size 50 --batch-size 4 --group-size 8 --max-draws 2 --temperature 0.7 --lr-warmup-steps 0
  --max-steps 4 --generation-batch-size 32 --micro-batch-size 4 --lora-rank 16 --lora-alpha 32
  --save-every 1 --keep-checkpoints 1 --plot-every 1 --show-examples 0 --seed 0"
finished() { [ -f "$1/summary.json" ] && grep -q '"finished": true' "$1/summary.json"; }
run() {  # name, then its own flags; peak memory of each invocation in name.time
  local name=$1; shift
  finished $name && return
  # --micro-batch-size 2 (added 2026-11-26 19:05): at 4 the 512 pilot was killed for memory in step 3 (24.3 GB
  # resident of 24); 2 regroups the update's sums (equal up to rounding), not what is learnt
  if [ -d $name ]; then /usr/bin/time -v -a -o $name.time python grpo_homework.py --resume $name \
    --micro-batch-size 2 >> $name.log 2>&1
  else /usr/bin/time -v -a -o $name.time python grpo_homework.py $MODEL $COMMON --output-dir $name "$@" \
    >> $name.log 2>&1
  fi
  finished $name
}
at512() {  # a pilot's final/ scored greedily at 512 tokens on the same 100 validation problems
  local out=$1-at512
  finished $out && return
  if [ -d $out ]; then python grpo_homework.py --resume $out >> $out.log 2>&1
  else python grpo_homework.py $1/final --eval-only --dataset $GSM8K --device cpu --dtype bfloat16 --val-size 200 \
    --eval-split validation --eval-size 100 --eval-batch-size 50 --max-new-tokens 512 --seed 0 \
    --output-dir $out >> $out.log 2>&1; fi
}
control() {  # budget: the starting model with "Be concise." added, no training
  [ -f control-$1.json ] && grep -q seconds_per_problem control-$1.json && return
  python /work/main/tests/bench_prompt.py $MODEL --dataset $GSM8K --split train --problems 100 --groups 0 \
    --instructions boxed-concise --eval-batch-size 50 --max-new-tokens $1 --dtype bfloat16 \
    --out control-$1.json >> control-$1.log 2>&1
}
run b512-lora-lr2e-4 --max-new-tokens 512 --learning-rate 2e-4 || exit 1
run b384-lora-lr2e-4 --max-new-tokens 384 --learning-rate 2e-4 --micro-batch-size 2 || exit 1
at512 b384-lora-lr2e-4
control 512
control 384
at512 b512-lora-lr2e-4     # added 2026-11-26 18:55: its merged final/ in bf16 against its own evaluation (adapters)
[ "${WITH_256:-0}" = 1 ] || exit 0          # notes.md: the 256 pilot runs only if 384 and 512 both fail its test
run b256-lora-lr2e-4 --max-new-tokens 256 --learning-rate 2e-4 --micro-batch-size 2 || exit 1
at512 b256-lora-lr2e-4
control 256
