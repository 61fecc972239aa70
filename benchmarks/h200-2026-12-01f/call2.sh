#!/bin/bash
# Call 2: packed GSM8K under sdpa and flex attention once more (the 0.36B Llama at micro batch 8, 40
# steps), then `--fp8` against bf16 on the 1B Llama at micro batch 16 with the loss compiled, twice
# (torchao staged: `bash ../shared/gpu/stage.sh torchao==0.18.0`). From the project root after
# `source .device/setup.sh`; writes $OUT/flex2.tgz and $OUT/fp8.tgz.
set -u
W=/tmp/w; mkdir -p $W
[ -d $W/llama-0.36b ] || python benchmarks/scripts/make_llama.py $W/llama-0.36b > /tmp/make036.log 2>&1
[ -d $W/llama-1b ] || SIZE=1b python benchmarks/scripts/make_llama.py $W/llama-1b > /tmp/make1b.log 2>&1
F=/tmp/flex2; rm -rf $F /tmp/o_*; mkdir -p $F
RUN_TIMEOUT=200 bash benchmarks/run.sh speed --out $F $W/llama-0.36b 8 40 \
  finetune:--dataset,gsm8k,--attn_implementation,flex_attention finetune:--dataset,gsm8k
tar -C /tmp -czf "$OUT/flex2.tgz" flex2
P=/tmp/fp8; rm -rf $P; mkdir -p $P
for r in 1 2; do
  [ "$SECONDS" -ge 420 ] && { echo "fp8 round $r skipped at ${SECONDS}s"; break; }
  FIRST_INDEX=$(( (r-1)*2 )) RUN_TIMEOUT=150 bash benchmarks/run.sh speed --out $P $W/llama-1b 16 20 finetune finetune:--fp8
  tar -C /tmp -czf "$OUT/fp8.tgz" fp8
done
