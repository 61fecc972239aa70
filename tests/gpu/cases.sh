#!/bin/bash
# Issue 6, one GPU: named speed cases (gpt2-medium, micro batch 8 unless BATCH/MODEL say otherwise),
# each one `speed.sh` run; results land in $OUT (tar them when more than 8 files).
# usage: bash tests/gpu/cases.sh STEPS CASE...
#   plain                  tests/gpu/plain_trainer.py, the baseline
#   single, zero2, zero3, fsdp, fsdp_grad_op      the profile's defaults on one process
#   fsdp-eager, fsdp_grad_op-eager       the same with --torch_compile false
#   single-regional, zero2-regional      compiled block by block (accelerate's regional compilation)
#   fsdp-regional, zero3-regional        the same, compile switched on
#   zero3-dsbuckets        ZeRO-3 with DeepSpeed's own bucket sizes instead of transformers' "auto"
#   zero3-deepcompile      ZeRO-3 with DeepSpeed's DeepCompile ("compile": {"deepcompile": true}), compiled;
#                          its first 10 steps (compile, profiling, recompile) are left out of the rates
#   zero3-deepcompile-dsbuckets          both
STEPS=$1; shift
MODEL=${MODEL:-gpt2-medium} BATCH=${BATCH:-8}
python tests/gpu/ds_buckets.py ds_configs/zero3.json /tmp/z3_dsbuckets.json \
  reduce_bucket_size=5e8 stage3_prefetch_bucket_size=5e7 stage3_param_persistence_threshold=1e5
python - <<'PY'
import json
for source, target in ("ds_configs/zero3.json", "/tmp/z3_deepcompile.json"), ("/tmp/z3_dsbuckets.json", "/tmp/z3_deepcompile_dsbuckets.json"):
    config = json.load(open(source))
    config["compile"] = {"deepcompile": True}
    json.dump(config, open(target, "w"), indent=1)
PY
REGIONAL=--dynamo_use_regional_compilation
n=0
run() { FIRST_INDEX=$((n-1)) RUN_TIMEOUT=${RUN_TIMEOUT:-400} bash tests/gpu/speed.sh $MODEL $BATCH $STEPS "$@"; }
for CASE in "$@"; do
  n=$((n+1))
  case $CASE in
    plain) run plain ;;
    single|zero2|zero3|fsdp|fsdp_grad_op) PROFILE=$CASE run finetune ;;
    fsdp-eager|fsdp_grad_op-eager) PROFILE=${CASE%-eager} TAG=eager run finetune:--torch_compile,false ;;
    single-regional) TAG=regional LAUNCH_FLAGS=$REGIONAL run finetune ;;
    fsdp-regional) PROFILE=fsdp TAG=regional LAUNCH_FLAGS=$REGIONAL run finetune:--torch_compile,true ;;
    # accelerate's DeepSpeed launcher passes no dynamo flags: the variable reaches the ranks as it is
    zero2-regional) ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=True PROFILE=zero2 TAG=regional run finetune ;;
    zero3-regional) ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=True PROFILE=zero3 TAG=regional \
                      run finetune:--torch_compile,true ;;
    zero3-dsbuckets) PROFILE=zero3 TAG=dsbuckets LAUNCH_FLAGS="--deepspeed_config_file /tmp/z3_dsbuckets.json" \
                       run finetune ;;
    zero3-deepcompile|zero3-deepcompile-dsbuckets)
      PROFILE=zero3 TAG=${CASE#zero3-} LAUNCH_FLAGS="--deepspeed_config_file /tmp/z3_${CASE#zero3-}.json" \
        run finetune:--torch_compile,true,--throughput_warmup_steps,10 ;;
    *) echo "cases.sh: unknown case $CASE" >&2; exit 2 ;;
  esac
done
