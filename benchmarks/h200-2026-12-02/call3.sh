#!/bin/bash
# Call 3 (one H200): what call 2 left open. gpt2-medium's checkpointed DoRA peak under single at micro
# batch 8 was predicted 1.24x: LoRA's at 8 (never measured checkpointed at 8) and DoRA's at 32 say
# whether the LoRA terms or DoRA's miss; zero2 compiled kept single's 4 bytes per output, not
# ZeRO-3's 8: zero1 compiled and zero2 eager say whether that holds by compile scope. From the project
# root after `source .device/setup.sh`: bash benchmarks/h200-2026-12-02/call3.sh /tmp/c3   ($OUT/c3.tgz)
R=$1; mkdir -p "$R"
(while sleep 20; do tar -czf "$OUT/c3.tgz" -C "$(dirname "$R")" "$(basename "$R")"; done) &
PACKER=$!
export CALIBRATE_TIMEOUT=165
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
python benchmarks/scripts/save_initialised.py gpt2-medium /tmp/m-init > "$R/save.log" 2>&1
PIDS=()
(export COMPILE=1 EXTRA="--gradient_checkpointing true" TAG=gc
 PEFT=lora cal lora_m8_gc /tmp/m-init single 8
 PEFT=dora cal dora_m32_gc /tmp/m-init single 32) & PIDS+=($!)
COMPILE=1 PEFT=dora cal dora_m8_zero1 /tmp/m-init zero1 8 & PIDS+=($!)
PEFT=dora cal dora_m8_zero2_eager /tmp/m-init zero2 8 & PIDS+=($!)
wait "${PIDS[@]}"
kill $PACKER; tar -czf "$OUT/c3.tgz" -C "$(dirname "$R")" "$(basename "$R")"
