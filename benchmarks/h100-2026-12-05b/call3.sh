#!/bin/bash
# One H100: FSDP2's gradients at the backward's start, out of sample. gpt2-xl compiled, one process, at
# micro batches small enough that the fp32 gradients (5.8 GiB) outweigh the activations: fsdp at 2
# and 4, fsdp_grad_op at 2. Predicted 24.05, 28.10 and 25.58 GiB without them held there (this
# commit's planner), 28.43, 33.50 and 31.18 with them (the planner before). usage: bash call3.sh OUT
OUT=$1; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)" >> $OUT/gpu.txt
export COMPILE=1 CALIBRATE_TIMEOUT=120
bash benchmarks/run.sh calibrate --out $OUT/fsdp 1 gpt2-xl fsdp "2 4" > $OUT/fsdp.txt 2>&1
bash benchmarks/run.sh calibrate --out $OUT/fsdp_grad_op 1 gpt2-xl fsdp_grad_op 2 > $OUT/fsdp_grad_op.txt 2>&1
