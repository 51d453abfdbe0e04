#!/bin/bash
# The device calls' pipeline on this CPU, end to end, with a tiny model: stash.sh for each chunk, then run.sh
# (join, SHA-256, dequantize, the homework: evaluation before, a step, the budget's stop, resume, evaluation after,
# records), then run.sh again (everything done: it only copies the records), then a run whose stop comes from the
# deadline rule alone. The model: make_tiny_gguf.py's cut of the real GGUF (Qwen2.5's tokenizer, 2 layers, the
# real Q4_K/Q6_K blocks), split into 3 chunks; the problems: GSM8K test 200-205, train 0-399; the reward: a
# stand-in (stub_reward.py), so that the steps update the weights.
#     bash plots/gpu-h200/dry_run.sh 2>&1 | tee plots/gpu-h200/dry-run.log      (needs prepare.py's outputs)
set -u -o pipefail
cd "$(dirname "$0")/../.."
H=plots/gpu-h200 D=/tmp/gpu-h200-dry
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DEQUANT_WORKERS=1      # this machine's 2 cores are shared
say() { echo; echo "##### $* ($(date +%T))"; }
rm -rf $D && mkdir -p $D/src $D/payload
say "a tiny GGUF cut from the real one, in 3 chunks with their manifest"
nice python3 $H/make_tiny_gguf.py gpu-chunks/model.gguf $D/src/tiny.gguf || exit 1
python3 - $D/src <<'EOF' || exit 1
import hashlib, json, math, pathlib, sys
src = pathlib.Path(sys.argv[1])
data = (src / "tiny.gguf").read_bytes()
each, chunks = math.ceil(len(data) / 3), []
for i in range(3):
    part = data[i * each:(i + 1) * each]
    (src / f"part-{i + 1:02d}").write_bytes(part)
    chunks.append({"name": f"part-{i + 1:02d}", "bytes": len(part), "sha256": hashlib.sha256(part).hexdigest()})
json.dump({"gguf": "tiny.gguf", "gguf_bytes": len(data), "gguf_sha256": hashlib.sha256(data).hexdigest(),
           "chunk_bytes": each, "chunks": chunks}, open(src / "manifest.json", "w"), indent=1)
print(f"tiny.gguf: {len(data):,} bytes in 3 chunks of {each:,}")
EOF
say "the payload: GSM8K as carried, the tiny GGUF's tokenizer files and config.json (as prepare.py makes them)"
cp -r gpu-chunks/payload/gsm8k $D/payload/
nice python3 $H/dequant.py $D/src/tiny.gguf $D/payload/hf --write-hf-files 2>&1 | grep -v -i warn

export G=$D/g OUT=$D/out MANIFEST=$D/src/manifest.json PAYLOAD=$D/payload SITE=$D/site SKIP_INSTALL=1 DEVICE=cpu
export EVAL_SIZE=6 EVAL_BATCH=6 EVAL_START=200
SMALL="--max-new-tokens 16 --group-size 4 --batch-size 2 --generation-batch-size 8 --micro-batch-size 4"
SMALL="$SMALL --train-size 400"
export HOMEWORK=$H/stub_reward.py     # a stand-in reward, so that groups differ and each step updates the weights
mkdir -p $D/snapshot && git show HEAD:grpo_homework.py > $D/snapshot/grpo_homework.py    # the file as committed: the
export HOMEWORK_DIR=$D/snapshot                                                      # working copy may be mid-edit
echo "grpo_homework.py as of $(git log -1 --format='%h %cd' --date=iso HEAD)"
say "the chunk calls"
for c in part-01 part-02 part-03; do SRC=$D/src bash $H/stash.sh $c || exit 1; done

say "the run call: STOP_AFTER=1 (the watchdog stops the run after step 1), --max-steps 5"
STOP_AFTER=1 MAX_STEPS=5 EXTRA="$SMALL" nice bash $H/run.sh; echo "run.sh exit $?"
say "its records"; ls -la $OUT; grep -h '"step"' $OUT/metrics.jsonl | cut -c1-160
python3 -c "import json; c = json.load(open('$OUT/config.json'))
print('argv', c['argv'][1:], '\nresumes', c['resumes'])"
head -c 600 $OUT/report_draft.md; echo; tar -tf $OUT/plots-and-logs.tar

say "the model folder against tests/build_qwen_coder.py's way (transformers' GGUF loader) in bf16, bit for bit"
nice python3 $H/dequant.py $D/src/tiny.gguf $D/tf --transformers 2>&1 | grep -v -i "warn\|Converting\|Loading weights"
nice python3 $H/same_model.py $G/model $D/tf || exit 1

say "the run call again (a second call on a warm machine): every stage done, records only"
OUT=$D/out2 nice bash $H/run.sh; echo "run.sh exit $?"

say "the deadline rule alone: a new run folder, --max-steps 50, BUDGET 90 s, priors scaled to this tiny model"
rm -rf $G/run
OUT=$D/out3 BUDGET=90 MAX_STEPS=50 CKPT_S=3 RESUME_S=20 SAVE_S=5 MARGIN_S=10 STEP_PRIOR_S=5 EXTRA="$SMALL" \
    nice bash $H/run.sh; echo "run.sh exit $?"
python3 -c "import json; s = json.load(open('$D/out3/summary.json')); print('steps', s['steps'], 'finished',
s['finished'], 'wall_seconds', round(s['wall_seconds']))"
rm -rf $D/tf $G/model.gguf
