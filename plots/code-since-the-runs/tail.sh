#!/bin/bash
# tail.sh: one tiny run at each commit of commits-tail.txt (6744fed, each later commit touching grpo_homework.py, to
# 1a43f53, the code this record was committed with), as sweep.sh plain ran; scripts/$c.py: git show $c:grpo_homework.py
cd /tmp/oldcode
mkdir -p sweep-tail
for c in $(cat /tmp/oldcode/commits-tail.txt); do
  ./runone.sh scripts/$c.py sweep-tail/$c --prompt-style plain --max-steps 2 --loss-agg drgrpo >/dev/null
  if [ -f sweep-tail/$c/metrics.jsonl ]; then python digest.py sweep-tail/$c > sweep-tail/$c.json; echo "$c ok"; else echo "$c FAIL"; fi
  rm -rf sweep-tail/$c/checkpoints sweep-tail/$c/plots
done
