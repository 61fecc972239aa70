#!/bin/bash
# Confirm `finetune plan --largest` by a run. usage: bash benchmarks/scripts/largest.sh NPROC PROFILE LADDER_NAME [STEPS]
# LADDER_NAME is a model_shapes.MODEL_LADDER shape (gpt2-xl, gpt-6.7b, ...). Trains it --from_scratch with
# micro batch 1 and gradient checkpointing (as the --largest plan assumes) for STEPS (default 4) steps,
# and writes beside the run's summary and log the planner's prediction for the same shape.
NPROC=$1 PROFILE=$2 NAME=$3 STEPS=${4:-4}
FLAGS=$(python -c "from finetune.limits import run_flags; print(run_flags('$NAME'))")
BASE=$OUT/largest.$NPROC.$PROFILE.$NAME
NVME=$([ "$PROFILE" = zero3_nvme ] && echo "--nvme_path /tmp/nvme_$NAME")
python -m finetune plan ${FLAGS/--from_scratch/} --gpus $NPROC --batch_size 1 --gradient_checkpointing --profiles $PROFILE \
  > $BASE.plan.txt 2>&1; free -g >> $BASE.plan.txt
timeout ${LARGEST_TIMEOUT:-500} accelerate launch --config_file accelerate_configs/$PROFILE.yaml --num_processes $NPROC \
  finetune/run.py $FLAGS $NVME --batch_size 1 --gradient_checkpointing true --block_size 1024 --max_steps $STEPS \
  --logging_steps 1 --throughput_warmup_steps 1 --max_eval_samples 2 --save_strategy no --report_to none \
  --disable_tqdm true --output_dir /tmp/largest_$NAME > $BASE.log 2>&1
echo "== largest $PROFILE $NAME on $NPROC: rc $?"
cp /tmp/largest_$NAME/run_summary.json $BASE.json
rm -rf /tmp/largest_$NAME /tmp/nvme_$NAME
tail -3 $BASE.plan.txt
python - $BASE.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
keys = ("status", "error", "memory_peak_allocated_gib_max", "memory_peak_reserved_gib_max", "memory_host_peak_rss_gib_max",
        "tokens_per_second_per_device", "mfu", "step_time_median_s")
print("  " + ", ".join(f"{k}={s.get(k)}" for k in keys))
print("  loss", [round(p["loss"], 3) for p in s.get("loss_curve", [])])
PY
