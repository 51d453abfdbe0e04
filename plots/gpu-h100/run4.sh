# 2026-11-26 (session 27): one call on a lent H100, 15 minutes of device time in all, start included. The items run
# in order of need, each under its own time limit, so one that hangs leaves the next; the call's limit cuts the tail.
# Carried: .whl (transformers 5.24.0, peft 0.21.2, datasets 5.2.0, dill, multiprocess: setup.sh's line) and .gpu
# (GSM8K's two parquet files; Qwen2.5's tokenizer files from the 0.5B folder). SMOKE=1: the same on a CPU, tiny.
set -u
if [ -z "${SMOKE:-}" ]; then      # a smoke test on a CPU uses what is installed there
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
G=plots/gpu-h100 D="--dataset .gpu/gsm8k" SHAPE="" W=$(mktemp -d)     # W: this call's model and run folders
[ -n "${SMOKE:-}" ] && SHAPE="--layers 1 --hidden-size 96"
step() { echo; echo "=== $1 ($(date +%T))"; }
END=$(( $(date +%s) + ${BUDGET:-480} ))     # the call's own limit is 560 s: the records are packed after this
run_for() {   # run_for LIMIT CMD...: at most LIMIT seconds, fewer if the budget is nearly spent, none under 30
    local left=$(( END - $(date +%s) )); local limit=$(( $1 < left ? $1 : left )); shift
    if [ "$limit" -lt 30 ]; then echo "skipped: ${left} s of the budget left"; return 0; fi
    timeout "$limit" "$@"; echo "exit $?"
}
step "versions"
python3 -c "import torch, transformers, peft, datasets; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'peft', peft.__version__, 'datasets', datasets.__version__)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
step "bench: the defaults, full, 4 x 16 x 256, micro-batch 4, generation batch 64"
run_for 130 python3 tests/bench_gpu.py $SHAPE --steps 3 --skip-compile
step "a random model of Qwen2.5-1.5B's shape, saved for the CLI"
run_for 90 python3 $G/make_model.py $W/qwen15 .gpu/tokenizer $SHAPE
step "CLI: LoRA 16 in bf16, 2 steps of 4 x 16 x 64, --kl-coef 0.05 (random weights score 0: the KL makes rows train)"
run_for 150 python3 grpo_homework.py $W/qwen15 $D --output-dir $W/r-lora --lora-rank 16 --learning-rate 2e-4 \
    --kl-coef 0.05 --min-signal-groups 0 --max-steps 2 --max-new-tokens 64 --eval-size 8 --save-every 1 \
    --show-examples 1
step "CLI: --eval-only on that run's final/ (merged, fp32)"
run_for 100 python3 grpo_homework.py $W/r-lora/final --eval-only $D --output-dir $W/r-lora-eval --eval-size 8 \
    --max-new-tokens 64 --show-examples 1
step "CLI: full fine-tuning with --kl-coef 0.05, allocator capped at 7.3 GiB (weights + reference 5.8): out of memory"
run_for 120 env CAP_GIB=7.3 python3 $G/capped.py grpo_homework.py $W/qwen15 $D --output-dir $W/r-oom --kl-coef 0.05 \
    --min-signal-groups 0 --max-steps 2 --max-new-tokens 32 --eval-size 4 --save-every 1 --show-examples 0
ls $W/r-oom $W/r-oom/checkpoints 2>&1
step "CLI: the resume it prints, uncapped"
run_for 120 python3 grpo_homework.py --resume $W/r-oom
step "bench: 24 GB full row, 4 x 16 x 1024, micro-batch 2, generation batch 64"
run_for 170 python3 tests/bench_gpu.py $SHAPE --steps 2 --skip-compile --max-new-tokens 1024 --micro-batch-size 2
step "bench: 16 GB fp32 row (T4, V100), LoRA 16, 2 x 8 x 512, micro-batch 2, generation batch 16"
run_for 120 python3 tests/bench_gpu.py $SHAPE --steps 2 --skip-compile --fp32 --lora-rank 16 --batch-size 2 \
    --group-size 8 --max-new-tokens 512 --micro-batch-size 2 --generation-batch-size 16
step "bench: 16 GB bf16 row, LoRA 16, 4 x 16 x 1024, micro-batch 2, generation batch 64"
run_for 170 python3 tests/bench_gpu.py $SHAPE --steps 2 --skip-compile --lora-rank 16 --max-new-tokens 1024 \
    --micro-batch-size 2
step "done"
[ -n "${OUT:-}" ] && tar czf "$OUT/records.tar.gz" -C "$W" --exclude='*.safetensors' r-lora r-lora-eval r-oom
