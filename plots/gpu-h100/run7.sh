# 2026-11-27 (session 37), the same lease's second call (445 s of device time left after run6.sh): the 80 GB row
# (full fine-tuning, 8 x 16 x 1024) that the 2026-11-24 notes list as never measured, at micro-batch 4.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
step() { echo; echo "=== $1 ($(date +%T))"; }
step "bench: 80 GB full row, 8 x 16 x 1024, micro-batch 4, generation batch 128"
timeout 230 python3 tests/bench_gpu.py --steps 2 --first-step-tokens 16 --skip-compile --batch-size 8 \
    --max-new-tokens 1024 --micro-batch-size 4 --generation-batch-size 128; echo "exit $?"
step "done"
