#!/bin/bash
# One GPU: what zero3's one-process step waits on, with native frames. py-spy attaches to a running
# run after its warm-up (the log's "step 10/"), so compile waits stay out of the window, and samples
# the C++ frames too (--native: autograd's backward thread runs mostly C++, unseen without them).
# Two windows of WINDOW s in one run: first --idle (every thread every tick, asleep too: where each
# waits), then without (what each runs). --native pauses the process for each sample (py-spy refuses
# --nonblocking with it), so the sampled steps are slower than unsampled; the run's summary has
# both. gpt2-medium 8 x 1024, zero3 then single (a GPU-bound step, for contrast). From the project
# root after `source .device/setup.sh`: bash call3.sh /tmp/c3 (packed into $OUT/c3.tgz after each case; CASES="zero3:90" for one).
# CPU dry run: OUT=/tmp WINDOW=2 EXTRA_FLAGS="--config_overrides n_layer=2,n_embd=64,n_head=2 --block_size 64"
R=$1; WINDOW=${WINDOW:-4}; mkdir -p "$R"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt"
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
for CASE in ${CASES:-zero3:90 single:250}; do  # PROFILE:STEPS, about 15 s after step 10 unsampled
  PROFILE=${CASE%:*} STEPS=${CASE#*:}
  C=$R/$PROFILE; mkdir -p $C
  timeout 200 python -m finetune.launch --config_file accelerate_configs/$PROFILE.yaml --num_processes 1 \
    --main_process_port 0 finetune/run.py --model gpt2-medium --from_scratch --max_steps $STEPS --batch_size 8 \
    --block_size 1024 --logging_steps 10 --max_eval_samples 16 --save_strategy no --report_to none \
    --disable_tqdm true --output_dir /tmp/c3_$PROFILE ${EXTRA_FLAGS:-} > $C/log 2>&1 &
  RUN=$!
  for _ in $(seq 1200); do grep -q "^step 10/" $C/log && break; sleep 0.1; done
  LAUNCHER=$(pgrep -o -f "finetune.launch .*--output_dir /tmp/c3_$PROFILE")
  for MODE in idle busy; do
    IDLE=(); [ $MODE = idle ] && IDLE=(--idle)
    $SPY record --pid $LAUNCHER --subprocesses --threads --native "${IDLE[@]}" --rate 100 \
      --duration $WINDOW --format raw --output $C/$MODE.stacks > $C/$MODE.spy.log 2>&1
    grep -h "^step " $C/log | tail -n 1 > $C/$MODE.after
  done
  wait $RUN; echo "rc $?" >> $C/log
  cp /tmp/c3_$PROFILE/run_summary.json $C/ 2>/dev/null
  gzip -f $C/*.stacks
  tar -czf "$OUT/$(basename "$R").tgz" -C "$(dirname "$R")" "$(basename "$R")"
done
