#!/bin/bash
# One H200: what a final evaluation with --chunked_loss holds inside a block, where it peaks once the
# loss no longer holds a block's logits. Memory snapshots from the end of training to the end of the
# evaluation (SNAPSHOT_OF=evaluation), one evaluation micro batch: gpt2-xl (trained from scratch at
# micro batch 8) evaluated at 128 under ddp on one process (compiled copy, fp32 residual stream) and
# fsdp (compiled in place, bf16 stream); make_llama.py's 1B Llama (gated MLP) evaluated at 64 under
# ddp compiled and single uncompiled (eager under autocast). Packed into DIR/call1.tgz after each
# case. From the project root, after `source .device/setup.sh`: bash benchmarks/h200-2026-12-02e/call1.sh DIR
R=$1; mkdir -p "$R" /tmp/call1
pack() { rm -f /tmp/call1/*.pickle; tar czf "$R/call1.tgz" -C /tmp call1; }
snapshot() {  # MODEL EVAL_BATCH CASE...
  local model=$1 eval=$2; shift 2
  OUT=/tmp/call1 TAG=chunked TOOL=memory_snapshot SNAPSHOT_OF=evaluation MODEL=$model BATCH=8 \
    RUN_FLAGS="--chunked_loss --per_device_eval_batch_size $eval --max_eval_samples $eval" \
    bash benchmarks/scripts/profile_cases.sh "$@" >> "$R/cases.log" 2>&1
  for d in /tmp/p_memory.*; do [ -f "$d/run_summary.json" ] && cp "$d/run_summary.json" "/tmp/call1/summary.${d#/tmp/p_memory.}.json"; done
  rm -rf /tmp/p_memory.*
  pack
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > /tmp/call1/gpu.txt
snapshot gpt2-xl 128 ddp fsdp
SIZE=1b timeout 120 python benchmarks/scripts/make_llama.py /tmp/llama-1b > /tmp/call1/make_llama.log 2>&1
snapshot /tmp/llama-1b 64 ddp single:--torch_compile,false
