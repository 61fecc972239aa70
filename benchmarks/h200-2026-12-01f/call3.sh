#!/bin/bash
# Call 3: packed GSM8K on the 0.36B Llama at micro batch 8, 40 steps, with flex attention switching
# the single profile's CUDA graphs off (this tree), against sdpa with and without them, alternating;
# then `--fp8` against bf16 on the 1B Llama at micro batch 16 (the loss compiled) if time is left
# (torchao staged: `bash ../shared/gpu/stage.sh torchao==0.18.0`). From the project root after
# `source .device/setup.sh`; writes $OUT/flex3.tgz and $OUT/fp8.tgz as each run ends.
set -u
W=/tmp/w; mkdir -p $W
[ -d $W/llama-0.36b ] || python benchmarks/scripts/make_llama.py $W/llama-0.36b > /tmp/make036.log 2>&1
F=/tmp/flex3; rm -rf $F /tmp/o_*; mkdir -p $F
FLEX=finetune:--dataset,gsm8k,--attn_implementation,flex_attention
SDPA=finetune:--dataset,gsm8k
i=0
one() {  # TAG VARIANT: one speed.sh run, numbered after the ones before
  FIRST_INDEX=$i TAG=$1 RUN_TIMEOUT=150 bash benchmarks/run.sh speed --out $F $W/llama-0.36b 8 40 "$2"
  i=$((i+1)); tar -C /tmp -czf "$OUT/flex3.tgz" flex3
}
one flex "$FLEX"
one sdpa-nographs "$SDPA,--torch_compile_mode,default"
one sdpa "$SDPA"
one flex "$FLEX"
one sdpa-nographs "$SDPA,--torch_compile_mode,default"
[ "$SECONDS" -ge 330 ] && { echo "fp8 skipped at ${SECONDS}s"; exit 0; }
[ -d $W/llama-1b ] || SIZE=1b python benchmarks/scripts/make_llama.py $W/llama-1b > /tmp/make1b.log 2>&1
P=/tmp/fp8; rm -rf $P; mkdir -p $P
RUN_TIMEOUT=120 bash benchmarks/run.sh speed --out $P $W/llama-1b 16 20 finetune finetune:--fp8
tar -C /tmp -czf "$OUT/fp8.tgz" fp8
