#!/bin/bash
# Issue 18 item 1 on one machine: the single profile, FSDP2 and ZeRO-3 on one process at the planner's
# micro batch for a global batch (BATCH g32), 20 steps, plus ZeRO-3 with the transformer blocks as
# DeepSpeed leaf modules. usage (project root, after `source .device/setup.sh`):
#   bash benchmarks/h100-2026-11-25d/commands_item1.sh MODEL CASE...   MODEL: gpt2-xl or llama-1b
# PROFILE_CASES="zero3 fsdp" then profiles steps 9-11 of those (micro batch PROFILE_BATCH, default 16)
# with torch.profiler. Each step is tarred into $OUT as it ends (the device returns at most 8 files a call).
set -u
R=/tmp/r W=/tmp/w DEADLINE=${DEADLINE:-500} NAME=$1; shift
mkdir -p "$R" "$W"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)"
} > "$OUT/gpu.txt" 2>/dev/null
MODEL=$NAME
if [ "$NAME" = llama-1b ]; then
  MODEL=$W/llama-1b; SIZE=1b python benchmarks/scripts/make_llama.py "$MODEL" > "$R/make_llama.log" 2>&1
fi
for CASE in "$@"; do
  if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "skipped $CASE after ${SECONDS}s"; continue; fi
  mkdir -p "$R/$CASE"
  MODEL=$MODEL BATCH=g32 RUN_TIMEOUT=${RUN_TIMEOUT:-200} bash benchmarks/run.sh cases --out "$R/$CASE" 20 "$CASE"
  tar -C "$R" -czf "$OUT/$NAME.$CASE.tgz" "$CASE"; echo "kept $CASE at ${SECONDS}s"
done
if [ -n "${PROFILE_CASES:-}" ] && [ "$SECONDS" -lt "$DEADLINE" ]; then
  mkdir -p "$R/profiles"
  MODEL=$MODEL BATCH=${PROFILE_BATCH:-16} RUN_TIMEOUT=${PROFILE_TIMEOUT:-150} bash benchmarks/run.sh profile --out "$R/profiles" $PROFILE_CASES
  tar -C "$R" -czf "$OUT/$NAME.profiles.tgz" profiles; echo "kept profiles at ${SECONDS}s"
fi
