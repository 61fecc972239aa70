#!/bin/bash
# One H200: CUDA graphs (--torch_compile_mode reduce-overhead) under ZeRO-1/2 through a SIGTERM and a
# resume, with an evaluation mid-run whose last batch is short (61 samples, micro batch 8), beside the
# same runs under torch.compile's default mode. usage: bash call1.sh OUT
OUT=$1; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)" >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt
export EXTRA="--eval_strategy steps --eval_steps 20 --max_eval_samples 61"
MODE=reduce-overhead bash benchmarks/run.sh resume_matches --out $OUT/graphs 1 zero2 zero1 > $OUT/graphs.txt 2>&1
MODE=default bash benchmarks/run.sh resume_matches --out $OUT/default 1 zero2 > $OUT/default.txt 2>&1
python benchmarks/scripts/tables.py resume_modes $OUT/graphs $OUT/default > $OUT/modes_table.md 2>&1
