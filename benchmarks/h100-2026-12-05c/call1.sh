#!/bin/bash
# One H100. First the row call 4 of h100-2026-12-05b lost when the call's limit cut its archive:
# gpt2-xl under fsdp_grad_op with --fp8 at micro batch 8, compiled (`finetune plan` predicts 35.73 GiB).
# Then each profile's host on one process, untraced, sampled by py-spy at 200 Hz with autograd's
# backward thread counted apart from the loop's (host_samples.py): gpt2-medium 8 x 1024, 30 steps.
# Everything tarred into OUT/call1.tgz as each part ends. usage: bash call1.sh OUT
OUT=$1; W=/tmp/c1; rm -rf $W; mkdir -p $W
git rev-parse HEAD > $W/commit.txt 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt
COMPILE=1 CALIBRATE_TIMEOUT=120 TAG=fp8 EXTRA=--fp8 \
  bash benchmarks/run.sh calibrate --out $W/fp8 1 gpt2-xl fsdp_grad_op 8 > $W/fp8.txt 2>&1
tar czf $OUT/call1.tgz -C /tmp c1
for CASE in SPY=1+zero3 SPY=1+single SPY=1+fsdp SPY=1+fsdp_grad_op SPY=1+zero2; do
  RUN_TIMEOUT=100 bash benchmarks/run.sh floor --out $W/spy gpt2-medium 8 30 "$CASE" >> $W/spy.txt 2>&1
  rm -f $W/spy/floor.tgz; tar czf $OUT/call1.tgz -C /tmp c1
done
