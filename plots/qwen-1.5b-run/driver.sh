#!/usr/bin/env bash
# #67 item 4: the 1.5B run and its scoring, as plan.md beside this file says (read it first). Qwen2.5-Coder-1.5B-
# Instruct (tests/build_qwen_coder.py --size 1.5b), LoRA on 2 CPU cores, alone (in fp32 for 4 steps since plan.md's
# addendum of 2026-11-27 16:50: this CPU has no bf16 instructions). Code: grpo_homework.py
# and tests/ as of the commit that added plan.md, copied once (code/), so a later edit cannot change the run.
# Scoring runs in chunks of 100 test problems (13 minutes each at 512 tokens in bf16 with AVX512-BF16; about an hour
# at 384 in fp32 on AVX2, avx2-fp32-eval/), so that a sitting's end loses
# at most one chunk; training checkpoints every step. Re-running skips what finished and resumes what stopped.
# Order: the starting model and the control first (they need no training), then the run, then the trained model.
# Added 2026-11-28 (plan.md): the machine was laid anew with the trained model's final/ lost after 6 of the 8
# chunks; the same recipe trains again from step 0 into run-b/, whose final/ scores the chunks still missing.
set -u
PLAN=$(git -C /work/main log --diff-filter=A --format=%H -- plots/qwen-1.5b-run/plan.md | tail -1)
[ -n "$PLAN" ] || { echo "plan.md is not committed"; exit 1; }
BUDGET=384
STEPS=4   # 16 until plan.md's addendum of 2026-11-27 16:50
PILOTS=/work/main/plots/qwen-1.5b-pilots
# The trained model's dtype at scoring, by the pilots' rule (notes.md, added 22:15): bf16 if the 512 pilot's merged
# final/ read in bf16 scored within 2 points of its own evaluation after (adapters unmerged), else float32
after_dtype() {
  python - $PILOTS <<'PY'
import json, sys
from pathlib import Path
pilots = Path(sys.argv[1])
own = json.loads((pilots / "b512-lora-lr2e-4" / "summary.json").read_text())["accuracy_after"]
merged = json.loads((pilots / "b512-lora-lr2e-4-at512" / "summary.json").read_text())["accuracy"]
print("bfloat16" if abs(merged - own) <= 0.02 + 1e-9 else "float32")
PY
}
WORK=/work/runs/qwen15-run
MODEL=/work/models/qwen2.5-coder-1.5b-instruct
GSM8K=/work/shared/gsm8k
mkdir -p $WORK && cd $WORK
[ -d code ] || { rm -rf code.partial && mkdir code.partial &&
  git -C /work/main archive $PLAN grpo_homework.py tests | tar -x -C code.partial && mv code.partial code; } || exit 1
BUDGETS=$(printf "%s\n" $BUDGET 512 | sort -un)
CHUNKS="200 300 400 500"
finished() { [ -f "$1/summary.json" ] && grep -q '"finished": true' "$1/summary.json"; }
score() {  # who (before/after), model folder, tokens, dtype: greedy --eval-only, test problems 200-599 in chunks
  local start out
  for start in $CHUNKS; do
    out=$1-$3/$start
    finished $out && continue
    mkdir -p $1-$3
    if [ -d $out ]; then python code/grpo_homework.py --resume $out >> $1-$3.log 2>&1   # restarts the chunk whole
    else python code/grpo_homework.py $2 --eval-only --dataset $GSM8K --device cpu --dtype $4 --eval-split test \
      --eval-start $start --eval-size 100 --eval-batch-size 50 --max-new-tokens $3 --seed 0 --output-dir $out \
      >> $1-$3.log 2>&1; fi
    finished $out || return 1
  done
}
control() {  # tokens: the starting model told "Be concise." (no training), the same problems, in chunks
  local start out
  for start in $CHUNKS; do
    out=control-$1/$start.json
    [ -f $out ] && grep -q seconds_per_problem $out && continue
    mkdir -p control-$1
    python code/tests/bench_prompt.py $MODEL --dataset $GSM8K --split test --start $start --problems 100 \
      --groups 0 --instructions boxed-concise --eval-batch-size 50 --max-new-tokens $1 --dtype bfloat16 \
      --out $out >> control-$1.log 2>&1
    [ -f $out ] && grep -q seconds_per_problem $out || return 1
  done
}
for tokens in $BUDGETS; do score before $MODEL $tokens bfloat16 || exit 1; done
for tokens in $BUDGETS; do control $tokens || exit 1; done
# The run: trained on train problems after the first 200; its own evaluations score 50 validation problems
RUN=run-b   # run until plan.md's addendum of 2026-11-28; the same settings
if ! finished $RUN; then
  # Added 2026-11-27 16:50 (plan.md): fp32, since this CPU computes bf16 2-5 times slower (avx2-matmul.txt); the
  # run's own evaluations on 50 validation problems and micro-batches of 1 row (fp32 peaked at 21.5 GiB at 2)
  if [ -d $RUN ]; then /usr/bin/time -v -a -o $RUN.time python code/grpo_homework.py --resume $RUN >> $RUN.log 2>&1
  else /usr/bin/time -v -a -o $RUN.time python code/grpo_homework.py $MODEL --dataset $GSM8K --device cpu \
    --dtype float32 --val-size 200 --eval-split validation --eval-size 50 --eval-batch-size 50 \
    --max-new-tokens $BUDGET --batch-size 4 --group-size 8 --max-draws 2 --temperature 0.7 --lr-warmup-steps 0 \
    --learning-rate 2e-4 --lora-rank 16 --lora-alpha 32 --max-steps $STEPS --generation-batch-size 32 \
    --micro-batch-size 1 --save-every 1 --keep-checkpoints 2 --plot-every 1 --show-examples 0 --seed 0 \
    --output-dir $RUN >> $RUN.log 2>&1; fi
  finished $RUN || exit 1
fi
AFTER_DTYPE=$(after_dtype) || exit 1
echo "the trained model is scored in $AFTER_DTYPE"
for tokens in $BUDGETS; do score after $RUN/final $tokens $AFTER_DTYPE || exit 1; done
echo "all scored"
# Beside, outside the test (plan.md, added 2026-11-28): run-b/final also at 512 on test problems 200-399, which
# run/final scored, to measure how far two trainings of the recipe part on the same problems; into after-b-512/
if [ $RUN = run-b ]; then CHUNKS="200 300"; score after-b $RUN/final 512 $AFTER_DTYPE || exit 1; echo "beside scored"; fi
