#!/bin/bash
# Issue 18 on one GPU, one model per invocation: named cases of `benchmarks/run.sh cases` (a case may
# be repeated for a median) at `--global_batch_size` BATCH (default g32; the plain script at micro
# batch 8 accumulated to it), then TOOL (profile_steps: torch.profiler over steps 9-11; memory_snapshot:
# what is alive at the memory peak) of PROFILE_CASES at micro batch PROFILE_BATCH, with PROFILE_FLAGS.
# usage (project root, after `source .device/setup.sh`):
#   [TAG=name RUN_FLAGS="..."] bash benchmarks/run.sh model_cases --out DIR MODEL CASE...
#   MODEL: a name, llama-1b or llama-0.36b. TAG keeps a second invocation on the same model apart (and
#   names its runs); RUN_FLAGS go to every finetune run and profile as they are.
# Everything is tarred again into $OUT/MODEL[-TAG].tgz as each case ends (the device returns at most 8
# files a call, and a call cut off keeps what finished); cases that would start after DEADLINE s are
# skipped.
set -u
NAME=$1; shift
KEY=$NAME${TAG:+-$TAG} W=/tmp/w DEADLINE=${DEADLINE:-480}
R=/tmp/r.$KEY
rm -rf "$R"; mkdir -p "$R" "$W"  # a warm machine keeps /tmp between calls
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)"
} > "$OUT/gpu.txt" 2>/dev/null
MODEL=$NAME
case $NAME in
  llama-*) MODEL=$W/$NAME
           [ -d "$MODEL" ] || SIZE=${NAME#llama-} python benchmarks/scripts/make_llama.py "$MODEL" > "$R/make_llama.log" 2>&1 ;;
esac
n=0
for CASE in "$@"; do
  n=$((n+1))
  if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "skipped $n.$CASE after ${SECONDS}s"; continue; fi
  mkdir -p "$R/$n.$CASE"; rm -rf /tmp/o_*  # speed.sh names its output folders per case, not per repeat
  MODEL=$MODEL BATCH=${BATCH:-g32} RUN_TIMEOUT=${RUN_TIMEOUT:-150} bash benchmarks/run.sh cases --out "$R/$n.$CASE" 20 "$CASE"
  tar -C "$R" -czf "$OUT/$KEY.tgz" .; echo "kept $n.$CASE at ${SECONDS}s"
done
if [ -n "${PROFILE_CASES:-}" ] && [ "$SECONDS" -lt "$DEADLINE" ]; then
  mkdir -p "$R/profiles"
  MODEL=$MODEL BATCH=${PROFILE_BATCH:-16} RUN_TIMEOUT=${PROFILE_TIMEOUT:-120} RUN_FLAGS="${RUN_FLAGS:-} ${PROFILE_FLAGS:-}" \
    bash benchmarks/run.sh profile --out "$R/profiles" $PROFILE_CASES
  tar -C "$R" -czf "$OUT/$KEY.tgz" .; echo "kept profiles at ${SECONDS}s"
fi
