#!/bin/bash
# One H200: `--fp8` peaks, single compiled as by default, gpt2-medium and gpt2-xl at micro batch 8, 16
# and 32, for the planner's float8 term (it counts bf16 matmuls' activations today); two calibrate.sh
# streams at once (peaks are each process's own; speeds are not results). usage: bash call2.sh OUT
OUT=$1; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import torch, transformers, accelerate, deepspeed, torchao; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__, torchao.__version__)" >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt
export COMPILE=1 CALIBRATE_TIMEOUT=170 EXTRA=--fp8 TAG=fp8
bash benchmarks/run.sh calibrate --out $OUT/xl 1 gpt2-xl single "8 16 32" > $OUT/xl.txt 2>&1 &
bash benchmarks/run.sh calibrate --out $OUT/medium 1 gpt2-medium single "8 16 32" > $OUT/medium.txt 2>&1 &
wait
