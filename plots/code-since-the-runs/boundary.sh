#!/bin/bash
# boundary.sh NAME [flags]: the tiny run at the commits around each change the plain sweep found, and at segment ends
N=$1; shift; mkdir -p bnd-$N
for c in ee633bf 5fb4bfe 35d204c 40be262 8c08cd6 c650507 6744fed; do
  [ -f scripts/$c.py ] || git -C /work/main show $c:grpo_homework.py > scripts/$c.py
  ./runone.sh /tmp/oldcode/scripts/$c.py /tmp/oldcode/bnd-$N/$c --prompt-style plain --max-steps 2 "$@" >/dev/null
  if [ -f bnd-$N/$c/metrics.jsonl ]; then python digest.py bnd-$N/$c > bnd-$N/$c.json; echo "$c ok"; else echo "$c FAIL"; tail -3 bnd-$N/$c.log; fi
  rm -rf bnd-$N/$c/checkpoints bnd-$N/$c/plots
done
p=""; for c in ee633bf 5fb4bfe 35d204c 40be262 8c08cd6 c650507 6744fed; do [ -n "$p" ] && echo "$N $p -> $c: $(python cmp.py bnd-$N/$p.json bnd-$N/$c.json)"; p=$c; done
