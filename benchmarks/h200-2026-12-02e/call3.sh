#!/bin/bash
# One H200: the evaluation's in-block count where it matters most, a long block: make_llama.py's 1B
# Llama from scratch, checkpointed, --chunked_loss, under single (compiled, no CUDA graphs under
# checkpointing: evaluation runs the compiled model), blocks of 65,536 and 131,072 tokens, 2 steps
# then one validation sample of the block (long_context.sh). Packed into DIR/long/long_context.tgz.
# From the project root, after `source .device/setup.sh`: bash benchmarks/h200-2026-12-02e/call3.sh DIR
R=$1; mkdir -p "$R/long"
SIZE=1b timeout 120 python benchmarks/scripts/make_llama.py /tmp/llama-1b > "$R/make_llama.log" 2>&1
PROFILE=single STEPS=2 WARMUP=1 RUN_TIMEOUT=240 RUN_FLAGS="--chunked_loss" \
  bash benchmarks/run.sh long_context --out "$R/long" /tmp/llama-1b 1 1 65536 131072
