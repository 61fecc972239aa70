#!/bin/bash
# Issue 6, one GPU: named speed cases (gpt2-medium, micro batch 8 unless BATCH/MODEL say otherwise),
# each one `speed.sh` run; results land in $OUT (tar them when more than 8 files).
# usage: bash benchmarks/scripts/cases.sh STEPS CASE...
#   plain                  benchmarks/scripts/plain_trainer.py, the baseline
#   single, zero2, zero3, fsdp, fsdp_grad_op      the profile's defaults on one process
#   fsdp-eager, fsdp_grad_op-eager       the same with --torch_compile false
#   single-regional, zero2-regional      compiled block by block (accelerate's regional compilation,
#                          the FSDP profiles' default)
#   zero3-compiled         ZeRO-3 with --torch_compile true: each leaf block's forward compiled, DeepSpeed's
#                          hooks left eager (run.py's compile_zero3_blocks, since 2026-11-25)
#   zero3-regional         ZeRO-3 under accelerate's regional compilation (each block's __call__, hooks
#                          included); since compile_zero3_blocks it runs as zero3-compiled does
#   zero3-auto-buckets     ZeRO-3 with transformers' "auto" bucket sizes (zero3.json's before 2026-11-24)
#   zero3-leaf-blocks      ZeRO-3 with the transformer blocks named as DeepSpeed leaf modules in its JSON
#                          (zero_optimization.leaf_module): one gather and one hook per block, as FSDP2
#                          wraps; run.py does the same by default since 2026-11-25 (gather_zero3_by_block)
#   zero3-per-module       ZeRO-3 with no leaf modules: DeepSpeed's hooks on every module (the default before)
#   fsdp-keep-unsharded    FSDP2 without resharding after forward (fsdp_reshard_after_forward false)
#   single-loss-eager      single with the loss left eager (--compile_loss false; compiled since 2026-11-26)
#   single-nodropout       single with GPT-2's dropout probabilities 0 (published: 0.1), GPT-2 models only
#   zero3-subgroup-1e8     ZeRO-3 with sub_group_size 1e8 (zero3.json: 1e9, DeepSpeed's default): the
#                          optimizer step makes each sub-group's fp32 gradients at once
#   zero3-deepcompile      ZeRO-3 with DeepSpeed's DeepCompile ("compile": {"deepcompile": true}), compiled;
#                          its first 10 steps (compile, profiling, recompile) are left out of the rates
STEPS=$1; shift
MODEL=${MODEL:-gpt2-medium} BATCH=${BATCH:-8}
AUTO='"auto"'
python benchmarks/scripts/ds_variant.py ds_configs/zero3.json /tmp/z3_auto-buckets.json zero_optimization.reduce_bucket_size=$AUTO \
  zero_optimization.stage3_prefetch_bucket_size=$AUTO zero_optimization.stage3_param_persistence_threshold=$AUTO
python benchmarks/scripts/ds_variant.py ds_configs/zero3.json /tmp/z3_leaf-blocks.json \
  'zero_optimization.leaf_module={"classes": ["GPT2Block", "LlamaDecoderLayer"]}'
python benchmarks/scripts/ds_variant.py ds_configs/zero3.json /tmp/z3_per-module.json \
  'zero_optimization.leaf_module={"classes": []}'
python benchmarks/scripts/ds_variant.py ds_configs/zero3.json /tmp/z3_subgroup-1e8.json zero_optimization.sub_group_size=100000000
python benchmarks/scripts/ds_variant.py ds_configs/zero3.json /tmp/z3_deepcompile.json compile='{"deepcompile": true}'
REGIONAL=--dynamo_use_regional_compilation
n=0
run() { FIRST_INDEX=$((n-1)) RUN_TIMEOUT=${RUN_TIMEOUT:-400} bash benchmarks/scripts/speed.sh $MODEL $BATCH $STEPS "$@"; }
for CASE in "$@"; do
  n=$((n+1))
  case $CASE in
    plain) run plain ;;
    single|zero2|zero3|fsdp|fsdp_grad_op) PROFILE=$CASE run finetune ;;
    fsdp-eager|fsdp_grad_op-eager) PROFILE=${CASE%-eager} TAG=eager run finetune:--torch_compile,false ;;
    single-regional) TAG=regional LAUNCH_FLAGS=$REGIONAL run finetune ;;
    # accelerate's DeepSpeed launcher passes no dynamo flags: the variable reaches the ranks as it is
    zero2-regional) ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=True PROFILE=zero2 TAG=regional run finetune ;;
    zero3-compiled) PROFILE=zero3 TAG=compiled run finetune:--torch_compile,true ;;
    zero3-regional) ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=True PROFILE=zero3 TAG=regional \
                      run finetune:--torch_compile,true ;;
    zero3-auto-buckets) PROFILE=zero3 TAG=auto-buckets LAUNCH_FLAGS="--deepspeed_config_file /tmp/z3_auto-buckets.json" \
                          run finetune ;;
    zero3-leaf-blocks) PROFILE=zero3 TAG=leaf-blocks LAUNCH_FLAGS="--deepspeed_config_file /tmp/z3_leaf-blocks.json" \
                         run finetune ;;
    zero3-per-module) PROFILE=zero3 TAG=per-module LAUNCH_FLAGS="--deepspeed_config_file /tmp/z3_per-module.json" \
                        run finetune ;;
    single-loss-eager) PROFILE=single TAG=loss-eager run finetune:--compile_loss,false ;;
    single-nodropout) PROFILE=single TAG=nodropout RUN_FLAGS="--config_overrides resid_pdrop=0,embd_pdrop=0,attn_pdrop=0" \
                        run finetune ;;
    zero3-subgroup-1e8) PROFILE=zero3 TAG=subgroup-1e8 LAUNCH_FLAGS="--deepspeed_config_file /tmp/z3_subgroup-1e8.json" \
                          run finetune ;;
    fsdp-keep-unsharded) PROFILE=fsdp TAG=keep-unsharded LAUNCH_FLAGS="--fsdp_reshard_after_forward false" run finetune ;;
    zero3-deepcompile) PROFILE=zero3 TAG=deepcompile LAUNCH_FLAGS="--deepspeed_config_file /tmp/z3_deepcompile.json" \
                         run finetune:--torch_compile,true,--throughput_warmup_steps,10 ;;
    *) echo "cases.sh: unknown case $CASE" >&2; exit 2 ;;
  esac
done
