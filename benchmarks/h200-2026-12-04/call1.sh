#!/bin/bash
# One H200: the launch-time refusals added on CPU (a folder not the run's own, mixed precision on CPU
# ranks, DeepSpeed JSON values the flags set otherwise, config sizes below 1) checked where they must
# stay silent: every one-process profile through the `finetune run` front end on CUDA with its default
# (bf16) precision, zero2 with --fp16, and the two refusals that must still fire on a GPU (a copied
# zero3 JSON whose gradient_clipping differs from --max_grad_norm; n_layer=0).
# From the project root, after `source .device/setup.sh`: bash benchmarks/h200-2026-12-04/call1.sh DIR
R=$1; mkdir -p "$R/runs"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$R/gpu.txt"
python -c "import torch, transformers, accelerate, deepspeed
print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__)" >> "$R/gpu.txt"
git log -1 --format=%H >> "$R/gpu.txt" 2>/dev/null
COMMON="--model gpt2 --from_scratch --max_steps 20 --batch_size 8 --max_eval_samples 16 --save_strategy no
 --report_to none --disable_tqdm true"
one() {  # NAME TIMEOUT FLAGS...: a front-end run; its rc, last lines and summary's key fields
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" python -m finetune run $COMMON --output_dir "/tmp/o_$name" "$@" > "$R/runs/$name.log" 2>&1
  local rc=$?
  echo "== $name rc $rc $((SECONDS - start)) s" >> "$R/progress.txt"
  tail -2 "$R/runs/$name.log" | cut -c1-300 >> "$R/progress.txt"
  cp "/tmp/o_$name/run_summary.json" "$R/runs/$name.summary.json" 2>/dev/null && python - "$R/runs/$name.summary.json" >> "$R/progress.txt" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("  " + ", ".join(f"{k}={s.get(k)}" for k in ("status", "profile", "dtype", "zero_stage", "torch_compile", "steps", "tokens_per_second", "mfu", "memory_peak_allocated_gib_max", "eval_loss")))
PY
}
for P in single zero2 zero3 fsdp fsdp_grad_op; do one "$P" 200 --profile "$P"; done
one zero2-fp16 200 --profile zero2 --fp16 true
one zero3_offload 300 --profile zero3_offload
mkdir -p /tmp/copied/ds_configs /tmp/copied/accelerate_configs
python - <<'PY'
import json
c = json.load(open("ds_configs/zero3.json")); c["gradient_clipping"] = 0.5
json.dump(c, open("/tmp/copied/ds_configs/zero3.json", "w"), indent=2)
PY
sed 's#ds_configs/zero3.json#/tmp/copied/ds_configs/zero3.json#' accelerate_configs/zero3.yaml > /tmp/copied/accelerate_configs/zero3.yaml
one refused-clipping 200 --profile /tmp/copied/accelerate_configs/zero3.yaml
one refused-n_layer 100 --profile single --config_overrides n_layer=0
