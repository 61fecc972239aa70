#!/bin/bash
# One GPU: what FSDP2 holds unsharded at a checkpointed step's end, by unit size (the planner's
# fsdp_unsharded_gib): gpt2-xl at micro batch 1, checkpointed, compiled, under fsdp with units of 4, 12
# and 48 blocks (predicted 24.10, 25.47 and 28.91 GiB at the backward's end) and under fsdp_grad_op with units
# of 4 (24.10: its whole bf16 copy, 2.9 GiB, is gone by then). One run at
# a time. usage: bash call1.sh OUT
OUT=$1; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__)" >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt 2>/dev/null
export COMPILE=1 CALIBRATE_TIMEOUT=${CALIBRATE_TIMEOUT:-150}
units() {  # PROFILE BLOCKS_PER_UNIT
  EXTRA="--gradient_checkpointing true --fsdp_blocks_per_unit $2" TAG=units$2 \
    bash benchmarks/run.sh calibrate --out $OUT/$1.units$2 1 gpt2-xl $1 1 > $OUT/$1.units$2.txt 2>&1
}
units fsdp 4; units fsdp 48; units fsdp_grad_op 4; units fsdp 12  # the widest apart first
