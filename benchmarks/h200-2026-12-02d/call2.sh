#!/bin/bash
# One H200: the final evaluation with the compiled model (before, single and ddp evaluated the eager
# original): gpt2-xl from scratch, 4 steps at micro batch 8 x 1024, then 512 validation samples at
# micro batch 128 (calibrate.sh's runs): compiled under single and ddp (one process: DDP around the
# compiled copy), eager, compiled with --chunked_loss, and compiled evaluating at steps 2 and 4 too
# (the final evaluation then finds its graphs compiled). Packed into DIR/call2.tgz. From the project
# root, after `source .device/setup.sh`: bash benchmarks/h200-2026-12-02d/call2.sh DIR
R=$1; mkdir -p "$R"; export OUT=/tmp/call2 CALIBRATE_TIMEOUT=150; mkdir -p $OUT
EVAL="--per_device_eval_batch_size 128 --max_eval_samples 512"
run() { bash benchmarks/scripts/calibrate.sh 1 gpt2-xl "$1" 8 >> "$R/calibrate.log" 2>&1; }
COMPILE=1 EXTRA="$EVAL" run "single ddp"
COMPILE=0 EXTRA="$EVAL" run single
COMPILE=1 EXTRA="$EVAL --chunked_loss" TAG=chunked run single
COMPILE=1 EXTRA="$EVAL --eval_strategy steps --eval_steps 2" TAG=warm run single
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
tar czf "$R/call2.tgz" -C /tmp call2
