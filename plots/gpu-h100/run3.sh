source .gpu/setup.sh
step() { echo; echo "=== $1 ($(date +%T))"; }
step "bench: 24 GB LoRA 16 row, 8 x 16 x 1024, micro 8, gen 128"
timeout 280 python3 tests/bench_gpu.py --steps 2 --skip-compile --lora-rank 16 --batch-size 8 --group-size 16 --max-new-tokens 1024 --micro-batch-size 8 --generation-batch-size 128 --logprob-chunk-size 1024 2>&1 | grep -v Writing
step "bench: 40 GB full row, 4 x 16 x 1024, micro 8, gen 64"
timeout 250 python3 tests/bench_gpu.py --steps 2 --skip-compile --batch-size 4 --group-size 16 --max-new-tokens 1024 --micro-batch-size 8 --generation-batch-size 64 --logprob-chunk-size 1024 2>&1 | grep -v Writing
step done
