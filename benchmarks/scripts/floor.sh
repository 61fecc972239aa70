#!/bin/bash
# The sharding floor, case by case on all visible GPUs, in turn: finetune's run (or the plain Trainer
# script) under a profile at micro batch BATCH x 1024 tokens, one summary and log per case, all packed
# into $OUT/floor.tgz after each case (the device tool brings back 8 files; a call cut short keeps
# what ended). usage: bash benchmarks/run.sh floor --out DIR MODEL BATCH STEPS CASE...
# BATCH - gives no --batch_size (cases that plan it: fsdp:--global_batch_size,128; no plain/ cases).
# MODEL a name in $FINETUNE_DATA_DIR trains --from_scratch; a folder of saved weights loads them (what
# --peft cases need: benchmarks/scripts/save_initialised.py makes one).
# A CASE is [ENV=VALUE+...][TOOL/]PROFILE[:flag,value,...][#tag]:
#   TOOL  run (default): finetune/run.py through `python -m finetune.launch` (what `finetune run` starts)
#         trace: benchmarks/scripts/rank_traces.py (every rank profiled, then trace_analysis.py's numbers)
#         plain: benchmarks/scripts/plain_trainer.py (the plain Trainer) under the same accelerate config
#         bare: benchmarks/scripts/bare_loop.py (torch's FSDP2/DDP in a hand-written loop, no finetune,
#               Trainer or accelerate) for single, ddp and the FSDP profiles
#         bare_trace: bare, then every rank's trace of 3 more steps and trace_analysis.py's numbers
#         base/: any of those with the code of $BASELINE (a folder with an older checkout) instead
#   PROFILE a name in accelerate_configs/ or a path to a YAML; NAME~KEY=JSON~... a changed copy of it
#         (profile_variant.py: fsdp~fsdp_config.fsdp_reshard_after_forward=false,
#         zero3~ds.timers.throughput.enabled=false)
#   ENV=VALUE+ environment for that case alone (NCCL_PROTO=Simple+fsdp); PIN=1+ runs each rank on its own
#         share of the cores (pin_and_run.py); SPY=1+ samples every process with py-spy at $SPY_RATE
#         (200) Hz, untraced (host_samples.py: each rank's host time in the training loop, by what);
#         SPY_IDLE=1+SPY=1+ samples sleeping threads too (py-spy --idle: where a thread waits), its
#         stacks kept, not summed by host_samples.py, whose host time counts running threads only
#         SPY_NATIVE=1+ (run cases) attaches py-spy once the log shows step $SPY_FROM (10), past the
#         warm-up's compilation, for $SPY_WINDOW (4) s at $SPY_RATE (100) Hz with C++ frames (--native:
#         what autograd's thread runs outside Python); --native pauses the process for each sample,
#         so the window's steps are slower and host_samples.py --window gives each thread's share
#         of the window's ticks (native_samples.json), not ms a step
# e.g. bash benchmarks/run.sh floor --out $OUT gpt2-medium 8 30 ddp fsdp fsdp:--torch_compile,false trace/fsdp
MODEL=$1 BATCH=$2 STEPS=$3; shift 3
N=${NPROC:-$(nvidia-smi -L | wc -l)}  # CPU dry run: NPROC=2 BLOCK=64 EXTRA_FLAGS="--config_overrides n_layer=2,n_embd=64,n_head=2"
HERE=$PWD PYSPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m
  python -c "import torch, transformers, accelerate, deepspeed; print(torch.__version__, torch.cuda.nccl.version(), transformers.__version__, accelerate.__version__, deepspeed.__version__)"
} > "$OUT/gpu.txt" 2>&1
for CASE in "$@"; do
  ENVS=""; REST=$CASE
  while [[ $REST == *=*+* && ${REST%%+*} == *=* ]]; do ENVS="$ENVS ${REST%%+*}"; REST=${REST#*+}; done
  TAG=""; [[ $REST == *'#'* ]] && { TAG=${REST#*#}; REST=${REST%%#*}; }
  CODE=$HERE; [[ $REST == base/* ]] && { CODE=${BASELINE:?BASELINE=folder of the older checkout}; REST=${REST#base/}; }
  TOOL=run; [[ $REST =~ ^(run|trace|plain|bare|bare_trace)/ ]] && { TOOL=${REST%%/*}; REST=${REST#*/}; }
  PROFILE=${REST%%:*}; EXTRA=$(echo "${REST#$PROFILE}" | sed 's/^://' | tr ',' ' ')
  CHANGES=(); if [[ $PROFILE == *~* ]]; then IFS='~' read -ra CHANGES <<< "${PROFILE#*~}"; PROFILE=${PROFILE%%~*}; fi
  [[ $PROFILE == *.yaml ]] && CONFIG=$PROFILE || CONFIG=$CODE/accelerate_configs/$PROFILE.yaml
  # the folder's name: the case cut to 80 characters, its repeat tag kept (tables.py pools by it)
  NAME=$(echo "${CASE%%#*}" | tr -c 'A-Za-z0-9_.=-' '_' | cut -c1-80); NAME=${NAME%_}${TAG:+_$TAG}
  BATCH_FLAG="--batch_size $BATCH"; [ "$BATCH" = - ] && BATCH_FLAG=""  # -: the case's flags choose it
  SOURCE="--from_scratch"; [ -d "$MODEL" ] && SOURCE=""
  FLAGS="--model $MODEL $SOURCE --max_steps $STEPS $BATCH_FLAG --block_size ${BLOCK:-1024}
    --logging_steps ${LOGGING_STEPS:-10} --max_eval_samples 16 --save_strategy no --report_to none
    --disable_tqdm true --output_dir /tmp/floor/$NAME ${EXTRA_FLAGS:-}"
  rm -rf /tmp/floor/$NAME; mkdir -p "$OUT/$NAME" /tmp/floor/variants
  if [ ${#CHANGES[@]} -gt 0 ]; then
    python benchmarks/scripts/profile_variant.py $CONFIG /tmp/floor/variants/$NAME.yaml "${CHANGES[@]}" || exit 2
    CONFIG=/tmp/floor/variants/$NAME.yaml; cp $CONFIG /tmp/floor/variants/$NAME.json "$OUT/$NAME/" 2>/dev/null
  fi
  PIN=""; [[ " $ENVS " == *" PIN=1 "* ]] && PIN=$HERE/benchmarks/scripts/pin_and_run.py
  IDLE=(); [[ " $ENVS " == *" SPY_IDLE=1 "* ]] && IDLE=(--idle)
  SPY=(); if [[ " $ENVS " == *" SPY=1 "* ]]; then  # every process sampled by py-spy, from outside
    SPY=("$PYSPY" record --subprocesses --threads --nonblocking
      --rate "${SPY_RATE:-200}" --format raw --output "/tmp/floor/$NAME.stacks" "${IDLE[@]}" --)
    rm -f "/tmp/floor/$NAME.stacks"
  fi
  START=$(date +%s) WATCH=""
  if [[ " $ENVS " == *" SPY_NATIVE=1 "* ]]; then  # beside the run, reading the log it writes below
    rm -f "/tmp/floor/$NAME.stacks" "/tmp/floor/$NAME.ended" "$OUT/$NAME/log"
    (until grep -q "^step ${SPY_FROM:-10}/" "$OUT/$NAME/log" 2>/dev/null; do
       [ -e "/tmp/floor/$NAME.ended" ] && exit; sleep 0.1; done  # a run that ended before the window
     LAUNCHER=$(pgrep -o -f -- "--output_dir /tmp/floor/$NAME( |$)") &&
     "$PYSPY" record --pid "$LAUNCHER" --subprocesses --threads --native \
       --rate "${SPY_RATE:-100}" --duration "${SPY_WINDOW:-4}" --format raw --output "/tmp/floor/$NAME.stacks" \
       > "$OUT/$NAME/spy.log" 2>&1) &
    WATCH=$!
  fi
  case $TOOL in
    run) (cd $CODE && env $ENVS PYTHONPATH=$CODE:$PYTHONPATH timeout ${RUN_TIMEOUT:-240} "${SPY[@]}" python -m finetune.launch \
          --config_file $CONFIG --num_processes $N --main_process_port 0 $PIN finetune/run.py $FLAGS $EXTRA) ;;
    trace) (cd $CODE && env $ENVS PYTHONPATH=$CODE:$PYTHONPATH timeout ${RUN_TIMEOUT:-240} python -m finetune.launch \
          --config_file $CONFIG --num_processes $N --main_process_port 0 $PIN $HERE/benchmarks/scripts/rank_traces.py \
          /tmp/traces/$NAME $FLAGS --max_steps 14 --logging_steps 50 $EXTRA) ;;
    plain) (cd $CODE && env $ENVS timeout ${RUN_TIMEOUT:-240} accelerate launch --config_file $CONFIG \
          --num_processes $N --main_process_port 0 $HERE/benchmarks/scripts/plain_trainer.py \
          $([ -d "$MODEL" ] && echo "$MODEL" || echo "$FINETUNE_DATA_DIR/$MODEL") $BATCH $STEPS "$OUT/$NAME/plain.json") ;;
    bare|bare_trace) (cd $CODE && env $ENVS PYTHONPATH=$CODE:$PYTHONPATH timeout ${RUN_TIMEOUT:-240} "${SPY[@]}" torchrun \
          --standalone --nproc_per_node $N $HERE/benchmarks/scripts/bare_loop.py --profile $CONFIG --model $MODEL \
          --batch $BATCH --block ${BLOCK:-1024} --steps $STEPS --out "$OUT/$NAME/bare.json" \
          $([ $TOOL = bare_trace ] && echo --trace /tmp/traces/$NAME) $EXTRA) ;;
    *) echo "floor.sh: unknown tool '$TOOL' in $CASE" >&2; exit 2 ;;
  esac > "$OUT/$NAME/log" 2>&1
  RC=$?
  cp /tmp/floor/$NAME/run_summary.json "$OUT/$NAME/" 2>/dev/null
  if [ -n "$WATCH" ]; then
    touch "/tmp/floor/$NAME.ended"; wait $WATCH
    [ -s "/tmp/floor/$NAME.stacks" ] && python benchmarks/scripts/host_samples.py --window "${SPY_WINDOW:-4}" "/tmp/floor/$NAME.stacks" "${SPY_RATE:-100}" \
      "$OUT/$NAME/native_samples.json" > "$OUT/$NAME/host_samples.log" 2>&1
  elif [ -s "/tmp/floor/$NAME.stacks" ] && [ ${#IDLE[@]} -eq 0 ]; then
    python benchmarks/scripts/host_samples.py "/tmp/floor/$NAME.stacks" "${SPY_RATE:-200}" "$OUT/$NAME" \
      > "$OUT/$NAME/host_samples.log" 2>&1
  fi
  [ -s "/tmp/floor/$NAME.stacks" ] && gzip -c "/tmp/floor/$NAME.stacks" > "$OUT/$NAME/stacks.txt.gz"
  if [[ $TOOL == *trace ]]; then
    cp /tmp/traces/$NAME/*.syncs.json "$OUT/$NAME/" 2>/dev/null
    timeout 120 python benchmarks/scripts/trace_analysis.py /tmp/traces/$NAME 3 "$OUT/$NAME/traces.json" \
      > "$OUT/$NAME/analysis.log" 2>&1
  fi
  echo "== $CASE rc $RC $(( $(date +%s) - START )) s: $(python benchmarks/scripts/floor_line.py "$OUT/$NAME" 2>&1 | tail -n 1)"
  tar -czf /tmp/floor.tgz -C "$OUT" --exclude floor.tgz . && mv /tmp/floor.tgz "$OUT/floor.tgz"
done
