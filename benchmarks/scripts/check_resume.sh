#!/bin/bash
# GPU round trip: train, SIGTERM after the first checkpoint, resume, export, eval, generate.
# usage: bash benchmarks/scripts/check_resume.sh NPROC PROFILE...
N=$1; shift
FLAGS="--model gpt2-medium --from_scratch --max_steps 60 --save_steps 20 --batch_size 8 --block_size 1024
 --logging_steps 10 --max_eval_samples 32 --report_to tensorboard --disable_tqdm true"
for P in "$@"; do
  O=/tmp/rt_$P
  echo "== $P: train, SIGTERM after checkpoint-20"
  FINETUNE_PROFILE=$P accelerate launch --config_file accelerate_configs/$P.yaml --num_processes $N \
    finetune/run.py $FLAGS --output_dir $O > $OUT/$P.train.log 2>&1 &
  LAUNCHER=$!
  until [ -f $O/checkpoint-20/finetune_checkpoint.json ]; do sleep 0.5; done
  pkill -TERM -f "^\S*python\S* (-u )?finetune/run.py.*--output_dir $O"
  wait $LAUNCHER; echo "launcher rc $?"; grep -h "exitcode\|finetune: stopped" $OUT/$P.train.log | sort | uniq -c
  python -c "import json; s=json.load(open('$O/run_summary.json')); print(s['status'], s['steps'], s['checkpoint'])"
  echo "== $P: resume"
  FINETUNE_PROFILE=$P accelerate launch --config_file accelerate_configs/$P.yaml --num_processes $N \
    finetune/run.py $FLAGS --output_dir $O --resume > $OUT/$P.resume.log 2>&1; echo "resume rc $?"
  python -c "import json; s=json.load(open('$O/run_summary.json')); print(s['status'], s['resumed_from_step'], s['steps'], 'eval_loss', s['eval_loss'], 'tokens/s', round(s['tokens_per_second']))"
  cp $O/run_summary.json $OUT/$P.summary.json
  echo "== $P: export checkpoint-60, eval, generate"
  python -m finetune export $O/checkpoint-60 /tmp/rt_${P}_export 2>&1 | tail -1
  python -m finetune eval /tmp/rt_${P}_export --block_size 1024 --max_tokens 32768 2>&1 | tail -1
  python -m finetune generate /tmp/rt_${P}_export --prompt "The history of" --max_new_tokens 20 --seed 1 2>&1 | tail -1
  ls $O
done
