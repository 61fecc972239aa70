#!/bin/bash
# The longest block that trains, unsplit and split over --sequence_parallel DEGREE, under $PROFILE
# (zero3 unless set: Ulysses; fsdp: ring attention, folders prefixed with the profile) on NPROC GPUs: MODEL --from_scratch at micro batch 1 with gradient checkpointing, its positions raised
# to the longest block asked for, each BLOCK in turn (ascending) until one fails (out of memory), for
# STEPS steps (default 8; WARMUP of them, default 3, left out of the throughput). A folder per case (spDEGREE.bBLOCK: log, run_summary.json, and
# `finetune plan`'s prediction for the same shape in plan.txt), a line per case in lines.txt;
# everything tarred into $OUT/long_context.tgz after each case (the device tool brings back 8 files).
# usage: bash benchmarks/run.sh long_context --out DIR MODEL NPROC DEGREE BLOCK...
# MODEL: a model folder (benchmarks/scripts/make_llama.py; SIZE=1b) or a name.
# CPU dry run: RUN_FLAGS="--precision fp32" NPROC=2 with a tiny model and blocks 64 128.
MODEL=$1 NPROC=$2 DEGREE=$3; shift 3
STEPS=${STEPS:-8} WARMUP=${WARMUP:-3} PROFILE=${PROFILE:-zero3}
TAG=$([ "$PROFILE" = zero3 ] || echo "$PROFILE.")
LONGEST=$(printf '%s\n' "$@" | sort -n | tail -1)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)"
} > "$OUT/gpu.txt" 2>&1
for SPLIT in $(printf '%s\n' 1 "$DEGREE" | sort -un); do  # DEGREE 1: the unsplit run alone
  for BLOCK in "$@"; do
    NAME=${TAG}sp$SPLIT.b$BLOCK
    FLAGS="--model $MODEL --from_scratch --config_overrides max_position_embeddings=$LONGEST --block_size $BLOCK
      --batch_size 1 --gradient_checkpointing --sequence_parallel $SPLIT --max_steps $STEPS --logging_steps 1
      --throughput_warmup_steps $WARMUP --max_eval_samples 1 --save_strategy no --report_to none --disable_tqdm true
      ${RUN_FLAGS:-}"
    mkdir -p "$OUT/$NAME"
    python -m finetune plan $FLAGS --gpus $NPROC --profiles $PROFILE > "$OUT/$NAME/plan.txt" 2>&1
    START=$(date +%s)
    timeout ${RUN_TIMEOUT:-300} python -m finetune.launch --config_file accelerate_configs/$PROFILE.yaml \
      --num_processes $NPROC --main_process_port 0 finetune/run.py $FLAGS --output_dir /tmp/long/$NAME \
      > "$OUT/$NAME/log" 2>&1
    RC=$?
    cp /tmp/long/$NAME/run_summary.json "$OUT/$NAME/" 2>/dev/null
    rm -rf /tmp/long/$NAME
    echo "== $NAME rc $RC $(( $(date +%s) - START )) s: $(python benchmarks/scripts/floor_line.py "$OUT/$NAME")" \
      | tee -a "$OUT/lines.txt"
    # written beside, then moved in: tar reading the folder it writes into calls it changed
    tar czf /tmp/long_context.tgz -C "$OUT" --exclude long_context.tgz . && mv /tmp/long_context.tgz "$OUT/"
    if [ $RC -ne 0 ]; then break; fi  # a longer block fails as well
  done
done
exit 0  # a case that fails is a result (lines.txt has its rc), not a failure of this script
