#!/bin/bash
# Sourced by the one-GPU benchmark scripts (instruction_lora.sh, lora_levers.sh): records the GPU and
# versions in $OUT/gpu.txt and defines
#   plain NAME SCRIPT MODEL_DIR BATCH   a plain baseline script of benchmarks/scripts
#   project NAME FLAGS...               finetune/run.py under the single profile (or $CONFIG) on one process
# each bounded by $RUN_TIMEOUT, leaving $OUT/NAME.json and .log and printing its rates (report).
# Reads STEPS, BLOCK, LOG_EVERY, RUN_TIMEOUT, WORK (run folders, deleted after each run) and OUT.
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> "$OUT/gpu.txt"
fi
python -c "import torch, transformers, accelerate, peft
print(torch.__version__, transformers.__version__, accelerate.__version__, peft.__version__)" >> "$OUT/gpu.txt"

report() {  # NAME RC: the run's rates and loss curve, to the call's output
  echo "== $1 rc $2"
  python - "$OUT/$1.json" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no summary:", e); sys.exit()
keys = ("tokens_per_second", "trained_tokens_per_second", "computed_tokens_per_second", "padding_share",
        "packing_efficiency", "peak_allocated_gib", "memory_peak_allocated_gib_max", "status", "error")
print("  " + ", ".join(f"{k}={s[k]}" for k in keys if s.get(k) is not None))
print(f"  loss curve {[round(p['loss'], 3) for p in s.get('loss_curve', [])]}")
PY
}

plain() {  # NAME SCRIPT MODEL_DIR BATCH
  timeout "$RUN_TIMEOUT" python "benchmarks/scripts/$2" "$3" "$4" "$STEPS" "$OUT/$1.json" > "$OUT/$1.log" 2>&1
  report "$1" $?
}

project() {  # NAME FLAGS...: run.py under the single profile on one process
  local name=$1; shift
  rm -rf "${WORK:?}/$name"
  timeout "$RUN_TIMEOUT" accelerate launch --config_file "${CONFIG:-accelerate_configs/single.yaml}" --num_processes 1 \
    finetune/run.py "$@" --max_steps "$STEPS" --block_size "$BLOCK" --logging_steps "$LOG_EVERY" \
    --max_eval_samples 16 --save_strategy no --report_to none --disable_tqdm true \
    --output_dir "$WORK/$name" > "$OUT/$name.log" 2>&1
  local rc=$?
  cp "$WORK/$name/run_summary.json" "$OUT/$name.json"
  rm -rf "${WORK:?}/$name"
  report "$name" $rc
}

