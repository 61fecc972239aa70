#!/bin/bash
# Call 2 (one H200): DoRA's peaks out of the sample that dora_output_bytes was read from (call 1):
# gpt2-medium at micro batch 16, the 1B Llama (grouped-query, 1.07B) at 8, zero2 (DeepSpeed's other
# stages), and gradient checkpointing; compiled as each profile runs by default (calibrate.sh, 4
# steps, --profile_memory). Streams run at once on the one GPU (peaks are per process); the 1B Llama
# starts with zero3 so that the two largest peaks do not meet. From the project root after
# `source .device/setup.sh`: bash benchmarks/h200-2026-12-02/call2.sh /tmp/c2   ($OUT/c2.tgz)
R=$1; mkdir -p "$R"
(while sleep 20; do tar -czf "$OUT/c2.tgz" -C "$(dirname "$R")" "$(basename "$R")"; done) &
PACKER=$!
export CALIBRATE_TIMEOUT=165 COMPILE=1 PEFT=dora
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
python benchmarks/scripts/save_initialised.py gpt2-medium /tmp/m-init > "$R/save.log" 2>&1
SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b >> "$R/save.log" 2>&1
PIDS=()
cal dora_m16 /tmp/m-init "single fsdp zero3" 16 & PIDS+=($!)
cal dora_llama1b /tmp/llama-1b "zero3 single fsdp" 8 & PIDS+=($!)
(cal dora_m8_zero2 /tmp/m-init zero2 8
 EXTRA="--gradient_checkpointing true" TAG=gc cal dora_m8_gc /tmp/m-init "single zero3" 8) & PIDS+=($!)
wait "${PIDS[@]}"
kill $PACKER; tar -czf "$OUT/c2.tgz" -C "$(dirname "$R")" "$(basename "$R")"
