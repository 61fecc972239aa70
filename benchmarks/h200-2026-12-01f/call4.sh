#!/bin/bash
# Call 4: `--fp8` against bf16 on the 1B Llama at micro batch 16, 20 steps, the loss compiled
# (torchao staged: `bash ../shared/gpu/stage.sh torchao==0.18.0`); a second round if time is left.
# From the project root after `source .device/setup.sh`; writes $OUT/fp8.tgz as each round ends.
set -u
W=/tmp/w; mkdir -p $W
[ -d $W/llama-1b ] || SIZE=1b python benchmarks/scripts/make_llama.py $W/llama-1b > /tmp/make1b.log 2>&1
P=/tmp/fp8; rm -rf $P /tmp/o_*; mkdir -p $P
for r in 1 2; do
  [ "$r" = 2 ] && [ "$SECONDS" -ge 190 ] && { echo "round 2 skipped at ${SECONDS}s"; break; }
  FIRST_INDEX=$(( (r-1)*2 )) RUN_TIMEOUT=110 bash benchmarks/run.sh speed --out $P $W/llama-1b 16 20 finetune finetune:--fp8
  tar -C /tmp -czf "$OUT/fp8.tgz" fp8
done
