#!/bin/bash
# Resume on GPUs ends where the uninterrupted run ends. usage: bash benchmarks/scripts/resume_matches.sh NPROC PROFILE...
# Per profile, gpt2 (124M) from scratch, 40 steps, a checkpoint every 20, eager (compilation is not what
# is checked, and it would dominate the time) unless MODE names torch.compile's mode (MODE=reduce-overhead:
# CUDA graphs, checked through a resume); EXTRA adds run.py flags (an evaluation mid-run, say). Runs: the
# uninterrupted run; a run whose ranks get SIGTERM after checkpoint-20, then `--resume`; and, on two
# processes or more, that checkpoint resumed on NPROC/2 processes (the world-size change halves the
# processes and doubles the accumulation: 4 x 8 on 3 would not divide) with --allow_world_size_change.
# Summaries and logs to $OUT; `tables.py resume` compares the loss curves.
N=$1; shift
FLAGS="--model gpt2 --from_scratch --max_steps 40 --save_steps 20 --batch_size 8 --block_size 512
 --logging_steps 5 --max_eval_samples 64 --report_to none --disable_tqdm true
 --config_overrides resid_pdrop=0,embd_pdrop=0,attn_pdrop=0 ${EXTRA:-}"
if [ -n "${MODE:-}" ]; then FLAGS+=" --torch_compile true --torch_compile_mode $MODE"; else FLAGS+=" --torch_compile false"; fi
launch() {  # PROFILE NPROC OUTPUT_DIR LOG [FLAGS...]
  local P=$1 NP=$2 O=$3 LOG=$4; shift 4
  FINETUNE_PROFILE=$P accelerate launch --config_file accelerate_configs/$P.yaml --num_processes $NP \
    --main_process_port 0 \
    finetune/run.py $FLAGS --output_dir $O "$@" > $LOG 2>&1
}
for P in "$@"; do
  echo "== $P: uninterrupted"
  launch $P $N /tmp/rm_${P}_straight $OUT/$P.straight.log; echo "rc $?"
  cp /tmp/rm_${P}_straight/run_summary.json $OUT/$P.straight.json
  echo "== $P: SIGTERM after checkpoint-20, then --resume"
  O=/tmp/rm_${P}_stopped
  launch $P $N $O $OUT/$P.stopped.log & LAUNCHER=$!
  until [ -f $O/checkpoint-20/finetune_checkpoint.json ] || ! kill -0 $LAUNCHER 2>/dev/null; do sleep 0.2; done
  pkill -TERM -f "finetune/run.py.*--output_dir $O( |$)"
  wait $LAUNCHER; echo "stopped launcher rc $?"
  cp $O/run_summary.json $OUT/$P.stopped.json
  mkdir -p /tmp/rm_${P}_smaller && cp -r $O/checkpoint-20 /tmp/rm_${P}_smaller/
  launch $P $N $O $OUT/$P.resumed.log --resume; echo "resume rc $?"
  cp $O/run_summary.json $OUT/$P.resumed.json
  if [ "$N" -ge 2 ]; then
    echo "== $P: checkpoint-20 resumed on $((N / 2)) process(es)"
    launch $P $((N / 2)) /tmp/rm_${P}_smaller $OUT/$P.smaller.log --resume --allow_world_size_change
    echo "smaller rc $?"
    cp /tmp/rm_${P}_smaller/run_summary.json $OUT/$P.smaller.json
  fi
  rm -rf /tmp/rm_${P}_*
done
python benchmarks/scripts/tables.py resume $OUT "$@" | tee $OUT/resume_table.md
