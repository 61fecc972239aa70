#!/bin/bash
# Call 4 (one H200): checkpointed peaks of the other profiles (zero1, zero2, fsdp_grad_op compiled;
# zero2_offload, zero3_offload eager as they run by default), gpt2-medium at 32 and gpt2-xl at 8.
# Streams at once on the one GPU (peaks are per process). From the project root, after
# `source .device/setup.sh`: bash benchmarks/h200-2026-11-29e/call4.sh /tmp/c4
R=$1; mkdir -p $R
export EXTRA="--gradient_checkpointing true" TAG=gc CALIBRATE_TIMEOUT=170
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
COMPILE=1 cal medium32 gpt2-medium "zero1 zero2 fsdp_grad_op" 32 &
COMPILE=1 cal xl8 gpt2-xl "zero1 zero2 fsdp_grad_op" 8 &
cal offload_m32 gpt2-medium "zero2_offload zero3_offload" 32 &
cal offload_xl8 gpt2-xl "zero2_offload zero3_offload" 8 &
wait
