#!/bin/bash
# One H200: `--fp8` peaks beyond single's GPT-2 rows, which check the planner's float8 terms from the CPU
# census: FSDP2 (bf16 weights: GPT-2 keeps a float8 cast of each gathered weight) on gpt2-xl and
# gpt2-medium at micro batch 8 and 32, and the 1B Llama (no weight cast kept) under single at 8 and 32
# and fsdp at 8. Two calibrate.sh streams at once on a GPU of 100 GiB or more (peaks are each process's
# own; speeds are not results), one after the other on a smaller one. usage: bash call1.sh OUT
OUT=$1; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import torch, transformers, accelerate, deepspeed, torchao; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__, torchao.__version__)" >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt 2>/dev/null
export COMPILE=1 CALIBRATE_TIMEOUT=170 TAG=fp8
SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > $OUT/make_llama.txt 2>&1 &
MAKING=$!
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
(EXTRA=--fp8 bash benchmarks/run.sh calibrate --out $OUT/xl 1 gpt2-xl fsdp "8 32" > $OUT/xl.txt 2>&1
 EXTRA=--fp8 bash benchmarks/run.sh calibrate --out $OUT/medium 1 gpt2-medium fsdp "8 32" > $OUT/medium.txt 2>&1) &
GPT2=$!
[ "$MIB" -ge 102400 ] || wait $GPT2
wait $MAKING
(EXTRA="--from_scratch --fp8" bash benchmarks/run.sh calibrate --out $OUT/llama 1 /tmp/llama-1b single "8 32" > $OUT/llama.txt 2>&1
 EXTRA="--from_scratch --fp8" bash benchmarks/run.sh calibrate --out $OUT/llama_fsdp 1 /tmp/llama-1b fsdp 8 > $OUT/llama_fsdp.txt 2>&1) &
wait
