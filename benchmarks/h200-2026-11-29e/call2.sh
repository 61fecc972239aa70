#!/bin/bash
# Call 2 (one H200): what is alive at checkpointed peaks (memory snapshots, gpt2-xl 8 and gpt2-medium
# 32 under single, fsdp, zero3), and more checkpointed calibration rows: the two Llamas compiled,
# gpt2-medium eager. Streams at once on the one GPU (peaks are per process). From the project root,
# after `source .device/setup.sh`: bash benchmarks/h200-2026-11-29e/call2.sh /tmp/c2
R=$1; mkdir -p $R
export CALIBRATE_TIMEOUT=170 RUN_TIMEOUT=170
snap() { mkdir -p $R/$1; OUT=$R/$1 TOOL=memory_snapshot MODEL=$2 BATCH=$3 RUN_FLAGS="--gradient_checkpointing true" \
  bash benchmarks/scripts/profile_cases.sh single fsdp zero3 > $R/$1.out 2>&1; rm -f $R/$1/*.pickle; }
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
(python benchmarks/scripts/make_llama.py /tmp/llama-0.36b; SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b) > $R/make.log 2>&1 &
MAKE=$!
snap snap_xl8 gpt2-xl 8 &
snap snap_m32 gpt2-medium 32 &
EXTRA="--gradient_checkpointing true" TAG=gc cal eager_m32 gpt2-medium "single fsdp zero3" 32 &
wait $MAKE
COMPILE=1 EXTRA="--gradient_checkpointing true" TAG=gc cal llama1b /tmp/llama-1b "single fsdp zero3" 8 &
COMPILE=1 EXTRA="--gradient_checkpointing true" TAG=gc cal llama036 /tmp/llama-0.36b "single fsdp zero3" 16 &
wait
