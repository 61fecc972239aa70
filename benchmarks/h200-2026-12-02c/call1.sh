#!/bin/bash
# One H200: evaluation's memory with the forward returning per-sample loss sums. The 1B Llama at the
# longest block `finetune plan --longest_block` names under PROFILE (single: 286,720 tokens) trains
# STEPS steps (default 1: the evaluation then holds Adam's states, as any final evaluation does) and
# evaluates one block. From the project root, after `source .device/setup.sh`:
# bash benchmarks/h200-2026-12-02c/call1.sh DIR [PROFILE] [BLOCK]
R=$1 PROFILE=${2:-single} BLOCK=${3:-286720}; mkdir -p "$R"
SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > "$R/make_llama.log" 2>&1
for i in 1 2 3 4 5 6 7 8; do cat "$FINETUNE_DATA_DIR/tiny-shakespeare/input.txt"; done > /tmp/long.txt
STEPS=${STEPS:-1} WARMUP=${WARMUP:-0} PROFILE=$PROFILE RUN_TIMEOUT=${RUN_TIMEOUT:-540} \
  RUN_FLAGS="--dataset /tmp/long.txt --validation_split_percentage 25" \
  bash benchmarks/run.sh long_context --out "$R/long" /tmp/llama-1b 1 1 "$BLOCK"
