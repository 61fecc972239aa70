#!/bin/bash
# Issue 6 speed runs on one GPU. usage: bash benchmarks/scripts/speed.sh MODEL BATCH STEPS VARIANT...
# VARIANT: plain (benchmarks/scripts/plain_trainer.py), finetune (run.py defaults), or finetune:<extra flags
# joined with commas>, e.g. finetune:--torch_compile,true,--chunked_loss. Each variant's summary
# and log go to $OUT as <index>.<variant name>.{json,log}. PROFILE=zero3 (etc.) runs the finetune variants
# under that profile on one process (default: single). LAUNCH_FLAGS adds flags to accelerate launch
# (e.g. --dynamo_use_regional_compilation) and TAG names them in the file names. BATCH gN runs the
# finetune variants with --global_batch_size N, the planner's micro batch for the profile, and the plain
# script at micro batch PLAIN_BATCH (default 8) with the accumulation that makes N. RUN_FLAGS adds
# flags to the finetune variants as they are, commas kept (--config_overrides a=0,b=0).
MODEL=$1 BATCH=$2 STEPS=$3 PROFILE=${PROFILE:-single}; shift 3
BATCH_FLAGS="--batch_size $BATCH"
case $BATCH in g*) BATCH_FLAGS="--global_batch_size ${BATCH#g}" ;; esac
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> $OUT/gpu.txt
python -c "import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__)" >> $OUT/gpu.txt
i=${FIRST_INDEX:-0}  # cases.sh numbers its runs across calls
MODEL_NAME=$(basename "$MODEL")  # MODEL may be a folder, such as make_llama.py's
if [ -d "$MODEL" ]; then MODEL_DIR=$MODEL; else MODEL_DIR=$FINETUNE_DATA_DIR/$MODEL; fi
for V in "$@"; do
  i=$((i+1)); NAME=$PROFILE${TAG:+-$TAG}.$MODEL_NAME.b$BATCH.$(echo "$V" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-50)
  if [ "$V" = plain ]; then
    PLAIN_ARGS="$BATCH $STEPS $OUT/$i.$NAME.json"  # BATCH gN: micro batch PLAIN_BATCH (8) accumulated to N
    case $BATCH in g*) PLAIN_ARGS="${PLAIN_BATCH:-8} $STEPS $OUT/$i.$NAME.json $(( ${BATCH#g} / ${PLAIN_BATCH:-8} ))" ;; esac
    timeout 300 python benchmarks/scripts/plain_trainer.py $MODEL_DIR $PLAIN_ARGS > $OUT/$i.$NAME.log 2>&1
    rc=$?
  else
    EXTRA=$(echo "${V#finetune}" | sed 's/^://' | tr ',' ' ')
    timeout ${RUN_TIMEOUT:-400} accelerate launch --config_file accelerate_configs/$PROFILE.yaml --num_processes 1 $LAUNCH_FLAGS finetune/run.py --model $MODEL \
      --from_scratch --max_steps $STEPS $BATCH_FLAGS --block_size 1024 --logging_steps 10 \
      --max_eval_samples 16 --save_strategy no --report_to none --disable_tqdm true --output_dir /tmp/o_${PROFILE}${TAG}_${MODEL_NAME}_$i $EXTRA ${RUN_FLAGS:-} \
      > $OUT/$i.$NAME.log 2>&1
    rc=$?
    cp /tmp/o_${PROFILE}${TAG}_${MODEL_NAME}_$i/run_summary.json $OUT/$i.$NAME.json
  fi
  echo "== $V rc $rc"
  python - $OUT/$i.$NAME.json <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no summary:", e); sys.exit()
keys = ("tokens_per_second_per_device", "tokens_per_second", "mfu", "step_time_median_s", "step_time_p90_s",
        "memory_peak_allocated_gib_max", "peak_allocated_gib", "status", "error")
print("  " + ", ".join(f"{k}={s[k]}" for k in keys if k in s))
curve = [round(point["loss"], 3) for point in s.get("loss_curve", [])]
print(f"  loss curve {curve} (a curve that does not fall means the run did not train: its speed is no result)")
PY
done
