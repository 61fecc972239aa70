#!/bin/bash
# One H200: the evaluation's in-block count (memory_model.evaluation_block_bytes, counted from call 1's
# snapshots) checked on shapes and profiles it was not counted from. calibrate.sh's runs (4 steps at
# micro batch 8 x 1024, then --chunked_loss evaluations of 256 samples): gpt2-large at 128 compiled
# under ddp and zero3, eager under single (autocast over fp32 weights) and fsdp (bf16 weights, no
# autocast); make_llama.py's 1B Llama at 64 compiled under fsdp and zero2, eager under zero3. Packed
# into DIR/call2.tgz after each run. From the project root, after `source .device/setup.sh`:
# bash benchmarks/h200-2026-12-02e/call2.sh DIR
R=$1; mkdir -p "$R"; export OUT=/tmp/call2 CALIBRATE_TIMEOUT=200; mkdir -p $OUT
run() {  # COMPILE MODEL EVAL_BATCH PROFILES
  COMPILE=$1 EXTRA="--chunked_loss --per_device_eval_batch_size $3 --max_eval_samples 256" TAG=chunked \
    bash benchmarks/scripts/calibrate.sh 1 "$2" "$4" 8 >> "$R/calibrate.log" 2>&1
  tar czf "$R/call2.tgz" -C /tmp call2
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
run 1 gpt2-large 128 "ddp zero3"
run 0 gpt2-large 128 "single fsdp"
SIZE=1b timeout 120 python benchmarks/scripts/make_llama.py /tmp/llama-1b > $OUT/make_llama.log 2>&1
run 1 /tmp/llama-1b 64 "fsdp zero2"
run 0 /tmp/llama-1b 64 zero3
