#!/usr/bin/env bash
# The free control on the run's own test problems: the starting model told "Be concise." (no training), greedy,
# 256 tokens, bf16, the first 200 GSM8K test problems; the same tool and flags as the pilots' control on validation.
set -u
cd /work/runs/qwen-gsm8k-b256
while pgrep -f "driver.sh" > /dev/null; do sleep 10; done   # after the evaluations at 512, alone
[ -f control-test-256.json ] && grep -q 'seconds_per_problem' control-test-256.json && exit 0
python /work/main/tests/bench_prompt.py /work/models/qwen2.5-coder-0.5b-instruct --dataset /work/shared/gsm8k \
  --split test --problems 200 --groups 0 --instructions boxed-concise --eval-batch-size 50 --max-new-tokens 256 \
  --dtype bfloat16 --out control-test-256.json >> control-test-256.log 2>&1
