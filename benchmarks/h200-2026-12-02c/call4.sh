#!/bin/bash
# One H200: call2.sh's evaluations with --chunked_loss (evaluation through losses.chunked_loss_sums):
# gpt2-xl from scratch, compiled, 4 steps at micro batch 8 x 1024, then 128 validation samples at
# micro batch 128, packed into DIR/call4.tgz. From the project root, after `source .device/setup.sh`:
# bash benchmarks/h200-2026-12-02c/call4.sh DIR [PROFILES]
R=$1 PROFILES=${2:-single zero2}; mkdir -p "$R"
COMPILE=1 TAG=chunked EXTRA="--chunked_loss --per_device_eval_batch_size 128 --max_eval_samples 128" \
  CALIBRATE_TIMEOUT=200 bash benchmarks/run.sh calibrate --out /tmp/call4 1 gpt2-xl "$PROFILES" 8 > "$R/calibrate.log" 2>&1
tar czf "$R/call4.tgz" -C /tmp call4
