#!/bin/bash
# Where LoRA's time goes on one GPU (issue 17 item 8), in one call: on make_llama.py's 0.36B Llama,
# micro batch 8 of 1024 tokens, WikiText-2, the plain Trainer + peft baseline beside run.py's full
# fine-tuning and its --peft lora default and variants (CASES, each NAME:FLAGS with commas for spaces;
# a NAME with "whole" runs with the whole model compiled as one graph instead of single.yaml's block by
# block), then torch.profiler around steps 9-11 of the LoRA default (profile_steps.py; PROFILE=0: not).
# usage: bash benchmarks/run.sh lora_levers --out DIR
# Then: python benchmarks/scripts/tables.py instruction_lora DIR (finetune_lora against plain_lora).
set -u
STEPS=${STEPS:-30} RUN_TIMEOUT=${RUN_TIMEOUT:-150} WORK=${WORK:-/tmp/lora_levers}
BLOCK=1024 LOG_EVERY=10 LLAMA=llama-0.36b
CASES=${CASES:-"finetune_full: finetune_lora:--peft,lora finetune_lora_nodropout:--peft,lora,--lora_dropout,0
  finetune_lora_eager:--peft,lora,--torch_compile,false"}
mkdir -p "$WORK"
source benchmarks/scripts/one_gpu_runs.sh
sed '/^dynamo_config:/,$d' accelerate_configs/single.yaml > "$WORK/single_whole.yaml"

timeout "$RUN_TIMEOUT" python benchmarks/scripts/make_llama.py "$WORK/$LLAMA" > "$OUT/make_llama.log" 2>&1
echo "== make_llama rc $?: $(grep '^make_llama:' "$OUT/make_llama.log")"
plain "plain_lora.$LLAMA.b8.run1" plain_lora.py "$WORK/$LLAMA" 8
for CASE in $CASES; do
  NAME=${CASE%%:*}; FLAGS=$(echo "${CASE#*:}" | tr ',' ' ')
  CONFIG=accelerate_configs/single.yaml
  case $NAME in *whole*) CONFIG=$WORK/single_whole.yaml ;; esac
  # shellcheck disable=SC2086 # FLAGS is a list of flags
  CONFIG=$CONFIG project "$NAME.$LLAMA.b8.run1" --model "$WORK/$LLAMA" --batch_size 8 $FLAGS
done
[ "${PROFILE:-1}" = 0 ] || timeout "$RUN_TIMEOUT" accelerate launch --config_file accelerate_configs/single.yaml --num_processes 1 \
  benchmarks/scripts/profile_steps.py "$OUT/profile.finetune_lora" --model "$WORK/$LLAMA" --peft lora \
  --batch_size 8 --max_steps 12 --block_size "$BLOCK" --logging_steps 10 --max_eval_samples 16 \
  --save_strategy no --report_to none --disable_tqdm true --output_dir "$WORK/profile" \
  > "$OUT/profile.finetune_lora.log" 2>&1
echo "== profile rc $? $(grep PROFILE "$OUT/profile.finetune_lora.log")"
python benchmarks/scripts/tables.py instruction_lora "$OUT" | tee "$OUT/lora_levers_table.md"
