#!/bin/bash
# Call 1: the 0.36B Llama at --global_batch_size 32 under single with the loss compiled (the default
# since it was last measured) and eager (`single-loss-eager`), alternating, beside the plain Trainer
# script at 8 x 4; then packed GSM8K at micro batch 8 under sdpa and flex attention, once each. From
# the project root after `source .device/setup.sh`; writes $OUT/llama-0.36b.tgz and $OUT/flex1.tgz.
set -u
DEADLINE=330 RUN_TIMEOUT=150 bash benchmarks/run.sh model_cases --out "$OUT" llama-0.36b \
  single plain single-loss-eager single single-loss-eager
F=/tmp/flex1; rm -rf $F /tmp/o_*; mkdir -p $F
RUN_TIMEOUT=200 bash benchmarks/run.sh speed --out $F /tmp/w/llama-0.36b 8 40 finetune:--dataset,gsm8k \
  finetune:--dataset,gsm8k,--attn_implementation,flex_attention
tar -C /tmp -czf "$OUT/flex1.tgz" flex1
