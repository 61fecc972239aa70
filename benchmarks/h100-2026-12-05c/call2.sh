#!/bin/bash
# One H100, after call1.sh. The 1B Llama under fsdp at the micro batch `finetune plan --gpus 1
# --gpu_memory 80 --global_batch_size 32` chooses (32 x 1, predicted 58.07 GiB; the plan keeps 68 of
# an 80 GB GPU; on an H200 58.91 allocated): its reserved memory on an 80 GB GPU, where it must fit.
# Then gpt2-medium's one-GPU MFU target on an H100 with batches page-locked (met on an H200 at the
# planner's 64 x 1; on 80 GB it plans 32 x 2), single beside the plain script, twice each, alternating.
# Each model tarred into OUT as its cases end. usage: bash call2.sh OUT
OUT=$1
BATCH=g32 DEADLINE=200 bash benchmarks/run.sh model_cases --out "$OUT" llama-1b fsdp
BATCH=g64 DEADLINE=420 bash benchmarks/run.sh model_cases --out "$OUT" gpt2-medium single plain single plain
