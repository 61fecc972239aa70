#!/bin/bash
# One GPU (H100 or H200), one process. First every rank's trace (here the one) of zero3 and single, gpt2-medium
# 8 x 1024: what holds one process's zero3 step beyond the host time py-spy found in it (62 of 125 ms
# on the previous H100 call). Then ZeRO-3's gradient reduce bucket on one process: the shipped 500M
# values against 50M and 20M (several_gpus call 38's cases), each twice, alternating, 30 steps, and
# the default and 20M once each under py-spy to see the epilogue's host work move into the backward's hooks.
# Every part tarred into OUT/call1.tgz as it ends; cases not started past DEADLINE s.
# usage: bash call1.sh OUT
OUT=$1; W=/tmp/c1; rm -rf $W; mkdir -p $W; T0=$(date +%s)
git rev-parse HEAD > $W/commit.txt 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt
B='~ds.zero_optimization.reduce_bucket_size'
case_in() {  # FOLDER STEPS TIMEOUT CASE: one floor.sh case, unless past the deadline
  if [ $(( $(date +%s) - T0 )) -gt ${DEADLINE:-500} ]; then echo "skipped past deadline: $4" >> $W/skipped.txt; return; fi
  RUN_TIMEOUT=$3 bash benchmarks/run.sh floor --out $W/$1 gpt2-medium 8 $2 "$4" >> $W/$1.txt 2>&1
  rm -f $W/$1/floor.tgz; tar czf $OUT/call1.tgz -C /tmp c1
}
case_in trace 20 150 trace/zero3
case_in trace 20 120 trace/single
for CASE in zero3 "zero3$B=50000000" "zero3$B=20000000" 'zero3#r2' "zero3$B=50000000#r2" "zero3$B=20000000#r2" \
  SPY=1+zero3 "SPY=1+zero3$B=20000000"; do
  case_in buckets 30 90 "$CASE"
done
