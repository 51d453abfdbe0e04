#!/usr/bin/env bash
# Copies the run's small records from its folder outside the repository into this one (plan.md: each sitting
# commits them as they come): finished scoring chunks, the control's files, the run's metrics, config, summary,
# its own evaluations, plots and logs, and the .time files. No weights, checkpoints or lock files.
set -eu
WORK=${1:-/work/runs/qwen15-run}
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$WORK"
for chunk in before-*/* after-*/*; do
  [ -f "$chunk/summary.json" ] && grep -q '"finished": true' "$chunk/summary.json" || continue
  mkdir -p "$HERE/$chunk" && cp "$chunk"/{config.json,eval.jsonl,summary.json} "$HERE/$chunk/"
done
for file in control-*/*.json *.log *.time; do [ -f "$file" ] && mkdir -p "$HERE/$(dirname "$file")" && cp "$file" "$HERE/$file"; done
for run in run run-b; do  # run-b: the same recipe trained again (plan.md, added 2026-11-28)
  [ -d $run ] || continue
  mkdir -p "$HERE/$run"
  for file in $run/metrics.jsonl $run/config.json $run/summary.json $run/eval_*.jsonl $run/before_after.md; do
    [ -f "$file" ] && cp "$file" "$HERE/$file"
  done
  [ -d $run/plots ] && cp -r $run/plots "$HERE/$run/"
done
echo "records copied into $HERE"
