#!/bin/bash
# One H200: the longest block `finetune plan --longest_block --gpus 1 --gpu_memory 139 --batch_size 1
# --gradient_checkpointing true --config_overrides max_position_embeddings=1048576` names for the 1B
# Llama with its own loss under PROFILE (single: 286,720 tokens; zero3: 349,184), trained for 2 steps
# and evaluated on one block. From the project root, after `source .device/setup.sh`:
# bash benchmarks/h200-2026-12-02b/call1.sh DIR [PROFILE] [BLOCK]
R=$1 PROFILE=${2:-single} BLOCK=${3:-286720}; mkdir -p "$R"
SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > "$R/make_llama.log" 2>&1
for i in 1 2 3 4 5 6 7 8; do cat "$FINETUNE_DATA_DIR/tiny-shakespeare/input.txt"; done > /tmp/long.txt
STEPS=2 WARMUP=1 PROFILE=$PROFILE RUN_TIMEOUT=${RUN_TIMEOUT:-540} \
  RUN_FLAGS="--dataset /tmp/long.txt --validation_split_percentage 25" \
  bash benchmarks/run.sh long_context --out "$R/long" /tmp/llama-1b 1 1 "$BLOCK"
