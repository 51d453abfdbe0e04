# 2026-11-26 (session 27), the same lease's second call (364 s of device time left after run4.sh): the two rows
# run4.sh's budget cut, each with a 16-token first step (its optimizer step allocates AdamW's moments, so the
# second, full-length step's peak is a run's). The first full-length generation still pays the allocator's
# warm-up (run4: 21.4 s against 8.2 s at 256 tokens), so its seconds are an upper bound.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
step() { echo; echo "=== $1 ($(date +%T))"; }
step "bench: 24 GB full row, 4 x 16 x 1024, micro-batch 2, generation batch 64"
timeout 130 python3 tests/bench_gpu.py --steps 2 --first-step-tokens 16 --skip-compile --max-new-tokens 1024 \
    --micro-batch-size 2; echo "exit $?"
step "bench: 16 GB fp32 row (T4, V100), LoRA 16, 2 x 8 x 512, micro-batch 2, generation batch 16"
timeout 80 python3 tests/bench_gpu.py --steps 2 --first-step-tokens 16 --skip-compile --fp32 --lora-rank 16 \
    --batch-size 2 --group-size 8 --max-new-tokens 512 --micro-batch-size 2 --generation-batch-size 16; echo "exit $?"
step "done"
