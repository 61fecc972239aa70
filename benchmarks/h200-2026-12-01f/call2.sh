#!/bin/bash
# Call 2: why flex attention ran 19x slower than sdpa on packed GSM8K in call 1 (the 0.36B Llama at
# micro batch 8, 40 steps, single's reduce-overhead mode): flex with dynamo's recompile and
# graph-break logs, flex under `--torch_compile_mode default` (no CUDA graphs), then sdpa and flex
# once more for a second run each. From the project root after `source .device/setup.sh`; writes
# $OUT/flex2.tgz as each run ends.
set -u
W=/tmp/w; mkdir -p $W
[ -d $W/llama-0.36b ] || python benchmarks/scripts/make_llama.py $W/llama-0.36b > /tmp/make036.log 2>&1
F=/tmp/flex2; rm -rf $F /tmp/o_*; mkdir -p $F
FLEX=finetune:--dataset,gsm8k,--attn_implementation,flex_attention
i=0
one() {  # TAG VARIANT [ENV...]: one speed.sh run, numbered after the ones before
  local tag=$1 v=$2; shift 2
  env "$@" FIRST_INDEX=$i TAG=$tag RUN_TIMEOUT=150 bash benchmarks/run.sh speed --out $F $W/llama-0.36b 8 40 "$v"
  i=$((i+1)); tar -C /tmp -czf "$OUT/flex2.tgz" flex2
}
one logs "$FLEX" TORCH_LOGS=recompiles,graph_breaks,cudagraphs
one default "$FLEX,--torch_compile_mode,default"
one "" finetune:--dataset,gsm8k
one "" "$FLEX"
