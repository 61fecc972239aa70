#!/bin/bash
# Call 3: CUDA graphs under zero2 and zero1 a third/second time at gpt2-medium 8 x 1024 (calls 1-2:
# 1.16-1.67x faster with them; ddp's step the same on its warm run), zero2 on gpt2-xl at 8 with and
# without them, then gpt2-xl's `--fp8` pair with the loss compiled (speed.sh, single) if time is left.
set -u
GRAPHS=--torch_compile_mode,reduce-overhead
for CASE in zero2 "zero2:$GRAPHS" zero1 "zero1:$GRAPHS"; do
  RUN_TIMEOUT=150 bash benchmarks/run.sh floor --out /tmp/graphs3 gpt2-medium 8 30 "$CASE"
  cp /tmp/graphs3/floor.tgz "$OUT/"
done
for CASE in zero2 "zero2:$GRAPHS"; do
  [ "$SECONDS" -ge 330 ] && { echo "stopped before xl $CASE at ${SECONDS}s"; break; }
  RUN_TIMEOUT=140 bash benchmarks/run.sh floor --out /tmp/graphs3-xl gpt2-xl 8 30 "$CASE"
  cp /tmp/graphs3-xl/floor.tgz "$OUT/floor-xl.tgz"
done
[ "$SECONDS" -ge 400 ] && { echo "fp8 skipped at ${SECONDS}s"; exit 0; }
P=/tmp/fp8; rm -rf $P /tmp/o_*; mkdir -p $P
RUN_TIMEOUT=120 bash benchmarks/run.sh speed --out $P gpt2-xl 8 25 finetune finetune:--fp8
tar -C /tmp -czf "$OUT/fp8.tgz" fp8
