#!/bin/bash
# Call 1 (one H200): DoRA's peaks, which the planner counted as LoRA's, compiled as each profile runs
# by default and eager, gpt2-medium and the 0.36B Llama at micro batch 8 under single, fsdp and zero3
# (4 steps, --profile_memory: calibrate.sh). Streams run at once on the one GPU (peaks are per
# process). From the project root after `source .device/setup.sh`:
#   bash benchmarks/h200-2026-12-02/call1.sh /tmp/c1   (tars /tmp/c1 into $OUT/c1.tgz every 20 s)
R=$1; mkdir -p "$R"
(while sleep 20; do tar -czf "$OUT/c1.tgz" -C "$(dirname "$R")" "$(basename "$R")"; done) &
PACKER=$!
export CALIBRATE_TIMEOUT=165
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
python benchmarks/scripts/save_initialised.py gpt2-medium /tmp/m-init > "$R/save.log" 2>&1
python benchmarks/scripts/make_llama.py /tmp/llama-0.36b >> "$R/save.log" 2>&1
PIDS=()
COMPILE=1 PEFT=dora cal dora_m8 /tmp/m-init "single fsdp zero3" 8 & PIDS+=($!)
PEFT=dora cal dora_m8_eager /tmp/m-init "single fsdp zero3" 8 & PIDS+=($!)
COMPILE=1 PEFT=dora cal dora_llama036 /tmp/llama-0.36b "single fsdp zero3" 8 & PIDS+=($!)
wait "${PIDS[@]}"
kill $PACKER; tar -czf "$OUT/c1.tgz" -C "$(dirname "$R")" "$(basename "$R")"
