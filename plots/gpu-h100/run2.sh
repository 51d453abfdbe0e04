source .gpu/setup.sh
step() { echo; echo "=== $1 ($(date +%T))"; }
T=".gpu/tiny-qwen --dataset .gpu/gsm8k --eval-size 8 --eval-batch-size 8 --max-new-tokens 64 --train-size 40 --show-examples 1 --plot-every 1"
step "CLI full FT on CUDA, 3 steps with a checkpoint at 2"
timeout 120 python3 grpo_homework.py $T --output-dir /tmp/r-full --max-steps 3 --save-every 2 --keep-checkpoints 1 2>&1 | tail -25; echo "rc=$?"
step "resume to 4 steps"
timeout 90 python3 grpo_homework.py --resume /tmp/r-full --max-steps 4 2>&1 | tail -8
tail -2 /tmp/r-full/metrics.jsonl | cut -c1-700
step "CLI LoRA + KL on CUDA"
timeout 120 python3 grpo_homework.py $T --output-dir /tmp/r-lora --max-steps 2 --lora-rank 8 --learning-rate 1e-5 --kl-coef 0.05 --save-every 1 2>&1 | tail -8
tail -1 /tmp/r-lora/metrics.jsonl | cut -c1-700
ls /tmp/r-full /tmp/r-lora /tmp/r-lora/final
step "bench: 24 GB LoRA 16 row, 8 x 16 x 1024, micro 8, gen 128"
timeout 200 python3 tests/bench_gpu.py --steps 2 --skip-compile --lora-rank 16 --batch-size 8 --group-size 16 --max-new-tokens 1024 --micro-batch-size 8 --generation-batch-size 128 --logprob-chunk-size 1024 2>&1 | grep -v Writing
step "bench: four generation ways at the default row"
timeout 200 python3 tests/bench_gpu.py --steps 2 2>&1 | grep -v Writing
step done
