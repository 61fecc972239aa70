#!/bin/bash
# One H200: call 2's evaluations again after two changes: evaluation runs the compiled model only
# where it records no CUDA graphs (single's reduce-overhead: eager there), and an evaluation forward
# counts its loss from the chunked loss sums instead of the model's own loss over the whole block.
# gpt2-xl from scratch, 4 steps at micro batch 8 x 1024, then 512 validation samples at micro batch
# 128 (calibrate.sh's runs): single eager and compiled with the model's own loss, ddp (one process)
# compiled with --chunked_loss. Packed into DIR/call3.tgz. From the
# project root, after `source .device/setup.sh`: bash benchmarks/h200-2026-12-02d/call3.sh DIR
R=$1; mkdir -p "$R"; export OUT=/tmp/call3 CALIBRATE_TIMEOUT=150; mkdir -p $OUT
EVAL="--per_device_eval_batch_size 128 --max_eval_samples 512"
run() {  # packed after each run: what ran comes back if the call is cut short
  bash benchmarks/scripts/calibrate.sh 1 gpt2-xl "$1" 8 >> "$R/calibrate.log" 2>&1; tar czf "$R/call3.tgz" -C /tmp call3
}
COMPILE=0 EXTRA="$EVAL" run single
COMPILE=1 EXTRA="$EVAL --chunked_loss" TAG=chunked run ddp
COMPILE=1 EXTRA="$EVAL" run single
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
tar czf "$R/call3.tgz" -C /tmp call3
