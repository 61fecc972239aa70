#!/bin/bash
# Issue 17 item 8 on one GPU, in one call: finetune beside the plain Trainer scripts.
# usage: bash benchmarks/run.sh instruction_lora --out DIR   (from anywhere; the scripts read $OUT)
#  (a) plain_instruction.py: gpt2-medium from scratch on GSM8K, prompt masked, padded batches of 16
#  (b) run.py, single profile: the same model and data (--dataset gsm8k: packed, loss on the answers),
#      micro batch PACKED_BATCH=4 blocks of 1024: 4,096 computed tokens a step, as the plain script's
#      16 padded examples compute about 4,300 (GSM8K's examples are 153 GPT-2 tokens on average)
#  (c) make_llama.py (a 0.36B Llama), then plain_lora.py: plain Trainer + peft LoRA, batch 8 of 1024
#  (d) run.py --model <that Llama> --peft lora: the same text (WikiText-2), micro batch 8 of 1024
# Each run is bounded by `timeout`, so one failure leaves the rest; REPEATS=N runs (a)-(d) N times
# interleaved (the table takes medians; FIRST_RUN=K numbers a later call's runs on into the same
# folder). Summaries, logs and gpu.txt go to $OUT as <setup>.<model>.b<micro batch>.run<N>.{json,log};
# models and run folders to WORK (not returned).
# Then: python benchmarks/scripts/tables.py instruction_lora $OUT. TINY=1 is a CPU dry run: 2 layers,
# width 64, 128-token blocks, 3 steps, fp32.
set -u
STEPS=${STEPS:-40} REPEATS=${REPEATS:-1} PACKED_BATCH=${PACKED_BATCH:-4} RUN_TIMEOUT=${RUN_TIMEOUT:-400}
WORK=${WORK:-/tmp/instruction_lora}
BLOCK=1024 LLAMA=llama-0.36b LOG_EVERY=10 SMALL_GPT2=() WARMUP=()
if [ "${TINY:-}" = 1 ]; then
  STEPS=3 BLOCK=128 LLAMA=llama-tiny LOG_EVERY=1
  SMALL_GPT2=(--config_overrides n_layer=2,n_embd=64,n_head=2) WARMUP=(--throughput_warmup_steps 1)
fi
mkdir -p "$WORK"
source benchmarks/scripts/one_gpu_runs.sh

timeout "$RUN_TIMEOUT" python benchmarks/scripts/make_llama.py "$WORK/$LLAMA" > "$OUT/make_llama.log" 2>&1
rc=$?
echo "== make_llama rc $rc: $(grep '^make_llama:' "$OUT/make_llama.log")"
FIRST_RUN=${FIRST_RUN:-1}  # a later call into the same folder numbers its runs on
for r in $(seq "$FIRST_RUN" $((FIRST_RUN + REPEATS - 1))); do
  plain "plain_instruction.gpt2-medium.b16.run$r" plain_instruction.py "$FINETUNE_DATA_DIR/gpt2-medium" 16
  project "finetune_instruction.gpt2-medium.b$PACKED_BATCH.run$r" --model gpt2-medium --from_scratch \
    --dataset gsm8k --batch_size "$PACKED_BATCH" "${SMALL_GPT2[@]}" "${WARMUP[@]}"
  plain "plain_lora.$LLAMA.b8.run$r" plain_lora.py "$WORK/$LLAMA" 8
  project "finetune_lora.$LLAMA.b8.run$r" --model "$WORK/$LLAMA" --peft lora --batch_size 8 "${WARMUP[@]}"
done
python benchmarks/scripts/tables.py instruction_lora "$OUT" | tee "$OUT/instruction_lora_table.md"
