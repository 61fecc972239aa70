#!/bin/bash
# One H200: the one-process compiled peaks calibration.json lacks (gpt2-large at micro batch 32 under
# every profile that compiles by default, gpt2-large zero2 and fsdp_grad_op at 16, gpt2-xl single at 8),
# two calibrate.sh streams at once on the one GPU (peaks are each process's own; speeds are not results).
# usage: bash call1.sh OUT
OUT=$1; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)" >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt
export COMPILE=1 CALIBRATE_TIMEOUT=170
bash benchmarks/run.sh calibrate --out $OUT/large32 1 gpt2-large "single zero3 fsdp zero2 fsdp_grad_op" 32 > $OUT/large32.txt 2>&1 &
( bash benchmarks/run.sh calibrate --out $OUT/xl8 1 gpt2-xl single 8 > $OUT/xl8.txt 2>&1
  bash benchmarks/run.sh calibrate --out $OUT/large16 1 gpt2-large "zero2 fsdp_grad_op" 16 > $OUT/large16.txt 2>&1 ) &
wait
