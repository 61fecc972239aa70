#!/bin/bash
# Call 2: CUDA graphs under ddp, zero1 and zero2 on one process once more (call 1 had ddp and zero2
# 1.27-1.31x faster with them, the FSDP profiles 12x slower), gpt2-medium at 8 x 1024, 30 steps;
# then gpt2-xl at micro batch 8 under ddp with and without them. Same as call 1 otherwise.
set -u
GRAPHS=--torch_compile_mode,reduce-overhead
for CASE in ddp "ddp:$GRAPHS" zero2 "zero2:$GRAPHS" zero1 "zero1:$GRAPHS"; do
  [ "$SECONDS" -ge 330 ] && { echo "stopped before $CASE at ${SECONDS}s"; break; }
  RUN_TIMEOUT=150 bash benchmarks/run.sh floor --out /tmp/graphs2 gpt2-medium 8 30 "$CASE"
  cp /tmp/graphs2/floor.tgz "$OUT/"
done
for CASE in ddp "ddp:$GRAPHS"; do
  [ "$SECONDS" -ge 450 ] && { echo "stopped before xl $CASE at ${SECONDS}s"; break; }
  RUN_TIMEOUT=140 bash benchmarks/run.sh floor --out /tmp/graphs-xl gpt2-xl 8 30 "$CASE"
  cp /tmp/graphs-xl/floor.tgz "$OUT/floor-xl.tgz"
done
