#!/bin/bash
# One GPU, per PROFILE[:extra,flags] given, gpt2-medium micro batch 8 (MODEL/BATCH override; a MODEL
# folder trains from its saved weights, a name from scratch): OUT/<tool>.<case>.json and .log per case.
#   TOOL=profile_steps (default): torch.profiler around steps 9-11 (issue 6)
#   TOOL=memory_snapshot: what is alive at the peak of the first two steps (issue 17 item 7)
#   TOOL=allocation_census: CPU allocations of the first three steps, live and peak at each mark (CPU runs)
# RUN_FLAGS adds flags to every case as they are (commas kept) and TAG names them in the file names;
# NPROC (default 1) processes per case (memory_snapshot then writes one table per rank).
# usage: bash benchmarks/scripts/profile_cases.sh CASE...   e.g. zero3 fsdp fsdp:--torch_compile,false single
MODEL=${MODEL:-gpt2-medium} BATCH=${BATCH:-8} TOOL=${TOOL:-profile_steps}
case $TOOL in profile_steps) MAX_STEPS=12 ;; memory_snapshot|allocation_census) MAX_STEPS=3 ;; *) echo "unknown TOOL $TOOL" >&2; exit 2 ;; esac
if [ -d "$MODEL" ]; then WEIGHTS=""; else WEIGHTS=--from_scratch; fi
for CASE in "$@"; do
  PROFILE=${CASE%%:*}; EXTRA=$(echo "${CASE#$PROFILE}" | sed 's/^://' | tr ',' ' ')
  if [[ " $EXTRA " == *" --peft "* && ! -d "$MODEL" ]]; then  # run.py refuses it after a launch's start-up
    echo "== $CASE skipped: --peft trains saved weights; MODEL=$MODEL is a name (save_initialised.py makes a folder)"
    continue
  fi
  NAME=${TOOL%%_*}.$PROFILE${TAG:+-$TAG}$(echo "$EXTRA" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-40).$(basename $MODEL).b$BATCH
  timeout ${RUN_TIMEOUT:-200} accelerate launch --config_file accelerate_configs/$PROFILE.yaml --num_processes ${NPROC:-1} \
    benchmarks/scripts/$TOOL.py $OUT/$NAME --model $MODEL $WEIGHTS --max_steps $MAX_STEPS --batch_size $BATCH \
    --block_size 1024 --logging_steps 10 --max_eval_samples 16 --save_strategy no --report_to none \
    --disable_tqdm true --output_dir /tmp/p_$NAME $EXTRA ${RUN_FLAGS:-} > $OUT/$NAME.log 2>&1
  echo "== $CASE rc $? $(grep -E 'PROFILE|SNAPSHOT|CENSUS' $OUT/$NAME.log)"
done
