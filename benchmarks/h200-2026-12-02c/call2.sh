#!/bin/bash
# One H200: the final evaluation's peak at a micro batch larger than training's, per profile: gpt2-xl
# from scratch, compiled (each profile's default), trained 4 steps at micro batch 8 x 1024, then 128
# validation samples evaluated at micro batch 128 (`calibrate.sh`'s runs, packed into DIR/call2.tgz:
# the device tool brings back 8 files). From the project root, after `source .device/setup.sh`:
# bash benchmarks/h200-2026-12-02c/call2.sh DIR [PROFILES]
R=$1 PROFILES=${2:-single fsdp zero2 zero3}; mkdir -p "$R"
COMPILE=1 EXTRA="--per_device_eval_batch_size 128 --max_eval_samples 128" CALIBRATE_TIMEOUT=200 \
  bash benchmarks/run.sh calibrate --out /tmp/call2 1 gpt2-xl "$PROFILES" 8 > "$R/calibrate.log" 2>&1
tar czf "$R/call2.tgz" -C /tmp call2
