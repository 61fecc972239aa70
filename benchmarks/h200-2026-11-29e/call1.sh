#!/bin/bash
# Call 1 (one H200): checkpointed compiled peaks, block 1024, for the planner's checkpointing terms.
# Streams run at once on the one GPU (peaks are per process). From the project root, after
# `source .device/setup.sh`: bash benchmarks/h200-2026-11-29e/call1.sh /tmp/c1
R=$1; mkdir -p $R
export COMPILE=1 EXTRA="--gradient_checkpointing true" TAG=gc CALIBRATE_TIMEOUT=170
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
python benchmarks/scripts/save_initialised.py gpt2-medium /tmp/m-init > $R/save.log 2>&1
cal medium8 gpt2-medium "single fsdp zero3" 8 &
cal medium32 gpt2-medium "single fsdp zero3" 32 &
cal xl_single gpt2-xl "single" "8 16" &
cal xl16 gpt2-xl "fsdp zero3" 16 &
PEFT=lora cal lora_m32 /tmp/m-init "single fsdp zero3" 32 &
wait
