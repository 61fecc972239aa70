#!/bin/bash
# Call 4 (one H200): LoRA's peaks beside call 3's DoRA ones, where the planner's LoRA terms had no
# row to check them: zero2 eager and compiled at micro batch 8, and checkpointed single at 32 (the
# checkpointed DoRA peaks at 8 and 32 were predicted 1.24x and 1.36x, and LoRA's at 8 1.24x). From the
# project root after `source .device/setup.sh`: bash benchmarks/h200-2026-12-02/call4.sh /tmp/c4
R=$1; mkdir -p "$R"
(while sleep 20; do tar -czf "$OUT/c4.tgz" -C "$(dirname "$R")" "$(basename "$R")"; done) &
PACKER=$!
export CALIBRATE_TIMEOUT=165 PEFT=lora
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
python benchmarks/scripts/save_initialised.py gpt2-medium /tmp/m-init > "$R/save.log" 2>&1
PIDS=()
cal lora_m8_zero2_eager /tmp/m-init zero2 8 & PIDS+=($!)
COMPILE=1 cal lora_m8_zero2 /tmp/m-init zero2 8 & PIDS+=($!)
COMPILE=1 EXTRA="--gradient_checkpointing true" TAG=gc cal lora_m32_gc /tmp/m-init single 32 & PIDS+=($!)
wait "${PIDS[@]}"
kill $PACKER; tar -czf "$OUT/c4.tgz" -C "$(dirname "$R")" "$(basename "$R")"
