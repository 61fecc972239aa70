#!/bin/bash
# One H100, one process: where zero3's threads sleep. py-spy with --idle (floor.sh's SPY_IDLE=1+)
# samples the loop's and autograd's backward thread also while they wait, gpt2-medium 8 x 1024, 30
# steps: zero3, then single (a GPU-bound step, where the host waits for the GPU). Then zero3 once
# more, unsampled, for the step on this machine. Tarred into OUT/call2.tgz as each case ends.
# usage: bash call2.sh OUT
OUT=$1; W=/tmp/c2; rm -rf $W; mkdir -p $W
git rev-parse HEAD > $W/commit.txt 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt
for CASE in SPY_IDLE=1+SPY=1+zero3 SPY_IDLE=1+SPY=1+single zero3; do
  RUN_TIMEOUT=90 bash benchmarks/run.sh floor --out $W/idle gpt2-medium 8 30 "$CASE" >> $W/idle.txt 2>&1
  rm -f $W/idle/floor.tgz; tar czf $OUT/call2.tgz -C /tmp c2
done
