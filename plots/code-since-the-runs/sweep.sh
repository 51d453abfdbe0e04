#!/bin/bash
# sweep.sh NAME [extra flags]: every commit touching grpo_homework.py from ee633bf to HEAD, one tiny run each
N=$1; shift
mkdir -p sweep-$N
for c in $(cat /tmp/oldcode/commits.txt); do
  /tmp/oldcode/runone.sh /tmp/oldcode/scripts/$c.py /tmp/oldcode/sweep-$N/$c "$@" >/dev/null
  if [ -f sweep-$N/$c/metrics.jsonl ]; then python /tmp/oldcode/digest.py sweep-$N/$c > sweep-$N/$c.json; echo "$c ok"; else echo "$c FAIL"; fi
  rm -rf sweep-$N/$c/checkpoints sweep-$N/$c/plots
done
