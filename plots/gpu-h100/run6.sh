# 2026-11-27 (session 37): one call on a lent GPU, 15 minutes of device time in all, start included: the three rows
# #66 still lacked, in order of need, each with a 16-token first step (it allocates AdamW's moments, so the timed
# second step's peak is a run's) and its own time limit, so one that hangs leaves the next. Carried: .whl (setup.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
step() { echo; echo "=== $1 ($(date +%T))"; }
step "versions"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, 'peft', peft.__version__)"
B="python3 tests/bench_gpu.py --steps 2 --first-step-tokens 16 --skip-compile"
step "bench: 16 GB bf16 row, LoRA 16, 4 x 16 x 1024, micro-batch 2, generation batch 64"
timeout 170 $B --lora-rank 16 --max-new-tokens 1024 --micro-batch-size 2; echo "exit $?"
step "bench: full, 2 x 8 x 512, micro-batch 4, generation batch 16"
timeout 100 $B --batch-size 2 --group-size 8 --max-new-tokens 512 --micro-batch-size 4 --generation-batch-size 16
echo "exit $?"
step "bench: LoRA 16, 8 x 16 x 1024, micro-batch 4, generation batch 128"
timeout 200 $B --lora-rank 16 --batch-size 8 --max-new-tokens 1024 --micro-batch-size 4 --generation-batch-size 128
echo "exit $?"
step "done"
