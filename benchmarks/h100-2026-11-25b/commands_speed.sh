#!/bin/bash
# One call of nvidia-h100-x1, from the project root after `source .device/setup.sh`; results under $R
# (packed into $OUT/results.tgz at the end). Issue 18 on one GPU: (1) gpt2-xl's start-up with an empty
# compile cache, by phase (weights now drawn on the GPU); (2) the 0.36B Llama against the plain
# Trainer script with the single profile's CUDA graphs, twice interleaved, and Liger-Kernel once;
# (3) whether single and zero3 start from the same weights (gpt2, dropout off, eager: step 1's loss).
# Steps are skipped once the call has run DEADLINE seconds.
set -u
R=${R:-/tmp/r} W=/tmp/w DEADLINE=${DEADLINE:-480}
mkdir -p "$R/startup" "$R/llama" "$R/same_weights" "$W"
step() { if [ "$SECONDS" -lt "$DEADLINE" ]; then "$@"; else echo "skipped after ${SECONDS}s: $*"; fi; }
[ -d "$W/llama-0.36b" ] || python benchmarks/scripts/make_llama.py "$W/llama-0.36b" > "$R/make_llama.log" 2>&1
startup() {  # gpt2-xl, micro batch 8, the single profile's defaults, caches empty
  TORCHINDUCTOR_CACHE_DIR=/tmp/ic_xl TRITON_CACHE_DIR=/tmp/tc_xl timeout 200 accelerate launch \
    --config_file accelerate_configs/single.yaml finetune/run.py --model gpt2-xl --from_scratch \
    --batch_size 8 --max_steps 25 --block_size 1024 --logging_steps 5 --throughput_warmup_steps 5 \
    --max_eval_samples 8 --save_strategy no --report_to none --disable_tqdm true --output_dir /tmp/o_xl \
    > "$R/startup/gpt2-xl.log" 2>&1
  echo "gpt2-xl start-up rc $?"; cp /tmp/o_xl/run_summary.json "$R/startup/gpt2-xl.json"; tail -12 "$R/startup/gpt2-xl.log"
}
same_weights() {  # PROFILE: two eager steps of gpt2 with dropout off; step 1's loss is the initial weights'
  timeout 150 accelerate launch --config_file accelerate_configs/$1.yaml --num_processes 1 finetune/run.py \
    --model gpt2 --from_scratch --config_overrides resid_pdrop=0,embd_pdrop=0,attn_pdrop=0 --torch_compile false \
    --batch_size 8 --max_steps 2 --block_size 1024 --logging_steps 1 --max_eval_samples 8 --save_strategy no \
    --report_to none --disable_tqdm true --output_dir /tmp/o_same_$1 > "$R/same_weights/$1.log" 2>&1
  echo "same weights $1 rc $?"; cp /tmp/o_same_$1/run_summary.json "$R/same_weights/$1.json"
  grep -E "^step 1/" "$R/same_weights/$1.log"
}
step startup
n=0
for V in plain finetune plain finetune finetune:--use_liger_kernel,true; do
  FIRST_INDEX=$n step bash benchmarks/run.sh speed --out "$R/llama" "$W/llama-0.36b" 8 30 "$V"; n=$((n+1))
done
step same_weights single
step same_weights zero3
tar czf "$OUT/results.tgz" -C "$R" .
echo "done in ${SECONDS}s"
