#!/bin/bash
# A later call of nvidia-h100-x1 (fresh machine), from the project root after `source .device/setup.sh`:
# GSM8K packed at micro batch 8 beside the plain padded script at micro batch 16, twice, interleaved
# (issue 17 item 8), with the functions instruction_lora.sh uses. Results in $OUT/gsm8k.
set -u
export OUT=$OUT/gsm8k
mkdir -p "$OUT"
STEPS=40 BLOCK=1024 LOG_EVERY=10 RUN_TIMEOUT=120 WORK=/tmp/gsm8k
mkdir -p "$WORK"
source benchmarks/scripts/one_gpu_runs.sh
for r in 1 2; do
  plain "plain_instruction.gpt2-medium.b16.run$r" plain_instruction.py "$FINETUNE_DATA_DIR/gpt2-medium" 16
  project "finetune_instruction.gpt2-medium.b8.run$r" --model gpt2-medium --from_scratch --dataset gsm8k \
    --batch_size 8
done
python benchmarks/scripts/tables.py instruction_lora "$OUT" | tee "$OUT/instruction_table.md"
