#!/bin/bash
# Call 5 (one H200): checkpointed compiled peaks of full fine-tuning, at shapes calibration.json holds
# from before training forwards returned their loss without logits (2026-12-01): LoRA's checkpointed
# single peaks (calls 3, 4) were 3 GiB under the planner's at micro batch 32. gpt2-medium single at 8
# and 32, gpt2-xl single at 8, gpt2-medium fsdp at 32. From the project root after
# `source .device/setup.sh`: bash benchmarks/h200-2026-12-02/call5.sh /tmp/c5   ($OUT/c5.tgz)
R=$1; mkdir -p "$R"
(while sleep 20; do tar -czf "$OUT/c5.tgz" -C "$(dirname "$R")" "$(basename "$R")"; done) &
PACKER=$!
export CALIBRATE_TIMEOUT=150 COMPILE=1 EXTRA="--gradient_checkpointing true" TAG=gc
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
PIDS=()
cal medium_single gpt2-medium single "32 8" & PIDS+=($!)
cal xl_single gpt2-xl single 8 & PIDS+=($!)
cal medium_fsdp gpt2-medium fsdp 32 & PIDS+=($!)
wait "${PIDS[@]}"
kill $PACKER; tar -czf "$OUT/c5.tgz" -C "$(dirname "$R")" "$(basename "$R")"
