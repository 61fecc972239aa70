#!/bin/bash
# A later call of nvidia-h100-x1 (fresh machine), from the project root after `source .device/setup.sh`,
# once the single profile asked for CUDA graphs (accelerate_configs/single.yaml, dynamo_mode
# reduce-overhead): the LoRA comparison of issue 17 as run.py now runs by default, twice interleaved,
# and gpt2-medium full fine-tuning under the same default. Results in $OUT/cuda_graphs.
set -u
export OUT=$OUT/cuda_graphs
STEPS=30 BLOCK=1024 LOG_EVERY=10 RUN_TIMEOUT=130 WORK=/tmp/cuda_graphs
mkdir -p "$OUT" "$WORK"
source benchmarks/scripts/one_gpu_runs.sh
python benchmarks/scripts/make_llama.py "$WORK/llama-0.36b" > "$OUT/make_llama.log" 2>&1
for r in 1 2; do
  plain "plain_lora.llama-0.36b.b8.run$r" plain_lora.py "$WORK/llama-0.36b" 8
  project "finetune_lora.llama-0.36b.b8.run$r" --model "$WORK/llama-0.36b" --peft lora --batch_size 8
done
project finetune.gpt2-medium.b8.run1 --model gpt2-medium --from_scratch --batch_size 8
python benchmarks/scripts/tables.py instruction_lora "$OUT" | tee "$OUT/lora_table.md"
