#!/bin/bash
# One H100, the rest of call 1 (cut by the call's time limit): the 1B Llama under --fp8 (no weight cast
# kept) under single at micro batch 32 and fsdp at 8; then the offload profiles' checkpointed peaks
# snapshotted (gpt2-xl, micro batch 8, eager), which the planner over-predicts 1.36x. One run at a
# time. usage: bash call2.sh OUT
OUT=$1; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import torch, transformers, accelerate, deepspeed, torchao; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__, torchao.__version__)" >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt 2>/dev/null
export CALIBRATE_TIMEOUT=150
SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > $OUT/make_llama.txt 2>&1
COMPILE=1 TAG=fp8 EXTRA="--from_scratch --fp8" \
  bash benchmarks/run.sh calibrate --out $OUT/llama 1 /tmp/llama-1b single 32 > $OUT/llama.txt 2>&1
COMPILE=1 TAG=fp8 EXTRA="--from_scratch --fp8" \
  bash benchmarks/run.sh calibrate --out $OUT/llama_fsdp 1 /tmp/llama-1b fsdp 8 > $OUT/llama_fsdp.txt 2>&1
NPROC=1 TOOL=memory_snapshot MODEL=gpt2-xl BATCH=8 RUN_TIMEOUT=140 RUN_FLAGS="--gradient_checkpointing true" \
  bash benchmarks/run.sh profile --out $OUT/snapshots zero2_offload zero3_offload > $OUT/snapshots.txt 2>&1
rm -f $OUT/snapshots/*.pickle
