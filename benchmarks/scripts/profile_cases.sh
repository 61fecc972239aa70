#!/bin/bash
# Issue 6, one GPU: benchmarks/scripts/profile_steps.py under each PROFILE[:extra,flags] given, gpt2-medium
# micro batch 8 (MODEL/BATCH override); OUT/<profile>.json and .log per case.
# usage: bash benchmarks/scripts/profile_cases.sh CASE...   e.g. zero3 fsdp fsdp:--torch_compile,false single
MODEL=${MODEL:-gpt2-medium} BATCH=${BATCH:-8}
for CASE in "$@"; do
  PROFILE=${CASE%%:*}; EXTRA=$(echo "${CASE#$PROFILE}" | sed 's/^://' | tr ',' ' ')
  NAME=profile.$PROFILE$(echo "$EXTRA" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-40).$MODEL.b$BATCH
  timeout ${RUN_TIMEOUT:-200} accelerate launch --config_file accelerate_configs/$PROFILE.yaml --num_processes 1 \
    benchmarks/scripts/profile_steps.py $OUT/$NAME --model $MODEL --from_scratch --max_steps 12 --batch_size $BATCH \
    --block_size 1024 --logging_steps 10 --max_eval_samples 16 --save_strategy no --report_to none \
    --disable_tqdm true --output_dir /tmp/p_$NAME $EXTRA > $OUT/$NAME.log 2>&1
  echo "== $CASE rc $? $(grep PROFILE $OUT/$NAME.log)"
done
