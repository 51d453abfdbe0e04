#!/bin/bash
# tail.sh: 6744fed, each later commit touching grpo_homework.py, and the working tree (scripts/work.py: the tree this
# record was committed with): one tiny run each, as sweep.sh plain ran (scripts/$c.py: git show $c:grpo_homework.py)
cd /tmp/oldcode
mkdir -p sweep-tail
for c in 6744fed $(git -C /work/main log --format=%h 6744fed..HEAD -- grpo_homework.py | tac) work; do
  ./runone.sh scripts/$c.py sweep-tail/$c --prompt-style plain --max-steps 2 --loss-agg drgrpo >/dev/null
  if [ -f sweep-tail/$c/metrics.jsonl ]; then python digest.py sweep-tail/$c > sweep-tail/$c.json; echo "$c ok"; else echo "$c FAIL"; fi
  rm -rf sweep-tail/$c/checkpoints sweep-tail/$c/plots
done
