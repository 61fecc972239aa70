#!/bin/bash
# Call 3: gpt2-medium at --global_batch_size 64 (the planner's 32 x 2) under single, with GPT-2's
# dropout, training forwards without logits (this tree) and with accelerate's fp32 copy of them
# (.baseline = 1481ab6), alternating, beside the plain Trainer script at 8 x 8. From the project root
# after `source .device/setup.sh`; $OUT/gpt2-medium-g64.tgz (this tree) and
# $OUT/gpt2-medium-base.tgz (the baseline) are written as each case ends.
set -u
export DEADLINE=330 BATCH=g64 RUN_TIMEOUT=110
base() { (cd .baseline && PYTHONPATH=$PWD:$PYTHONPATH TAG=base bash benchmarks/run.sh model_cases --out "$OUT" gpt2-medium "$@"); }
TAG=g64 bash benchmarks/run.sh model_cases --out "$OUT" gpt2-medium single
base single
TAG=g64r2 bash benchmarks/run.sh model_cases --out "$OUT" gpt2-medium single plain
base single
