#!/bin/bash
# One H200: what the final evaluation holds with --chunked_loss (gpt2-xl from scratch, micro batch 8,
# 128 validation samples evaluated at micro batch 128), by memory snapshot from the end of training to
# the end of the evaluation, under single (compiled, CUDA graphs), zero2 (compiled, no graphs) and
# single uncompiled; packed into DIR/call1.tgz. From the project root, after `source .device/setup.sh`:
# bash benchmarks/h200-2026-12-02d/call1.sh DIR
R=$1; mkdir -p "$R" /tmp/call1
OUT=/tmp/call1 TAG=chunked TOOL=memory_snapshot SNAPSHOT_OF=evaluation MODEL=gpt2-xl BATCH=8 \
  RUN_FLAGS="--chunked_loss --per_device_eval_batch_size 128 --max_eval_samples 128" \
  bash benchmarks/scripts/profile_cases.sh single zero2 single:--torch_compile,false > "$R/cases.log" 2>&1
rm -f /tmp/call1/*.pickle
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > /tmp/call1/gpu.txt
tar czf "$R/call1.tgz" -C /tmp call1
