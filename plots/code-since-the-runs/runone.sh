#!/bin/bash
# usage: runone.sh SCRIPT OUTDIR [extra flags]
S=$1; O=$2; shift 2
rm -rf "$O"
TQDM_DISABLE=1 PYTHONHASHSEED=0 python "$S" /tmp/oldcode/inputs/model --dataset /tmp/oldcode/inputs/data --output-dir "$O" \
  --device cpu --dtype float32 --prompt-style chat --eval-size 8 --batch-size 4 --group-size 8 --max-new-tokens 8 \
  --generation-batch-size 32 --eval-batch-size 8 --micro-batch-size 4 --max-draws 2 --lr-warmup-steps 0 \
  --learning-rate 5e-4 --max-steps 3 --plot-every 0 --seed 0 "$@" > "$O.log" 2>&1
echo "rc=$? $O"
