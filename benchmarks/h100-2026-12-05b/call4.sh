#!/bin/bash
# One H100, with the session's last device minutes: `--fp8` under fsdp_grad_op, whose gathered bf16
# copy (and GPT-2's float8 cast of each gathered weight) stays from the forward into the backward:
# gpt2-medium, then gpt2-xl, at micro batch 8, compiled. Predicted 10.47 and 35.73 GiB (fsdp's measured
# 10.23 and 33.78, call 1). Each case tarred into OUT as it ends. usage: bash call4.sh OUT
OUT=$1; mkdir -p /tmp/c4
nvidia-smi --query-gpu=name,driver_version --format=csv > /tmp/c4/gpu.txt
export COMPILE=1 CALIBRATE_TIMEOUT=110 TAG=fp8 EXTRA=--fp8
for MODEL in gpt2-medium gpt2-xl; do
  bash benchmarks/run.sh calibrate --out /tmp/c4/$MODEL 1 $MODEL fsdp_grad_op 8 > /tmp/c4/$MODEL.txt 2>&1
  tar czf $OUT/call4.tgz -C /tmp c4
done
