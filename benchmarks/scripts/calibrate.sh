#!/bin/bash
# Planner calibration runs. usage: bash benchmarks/scripts/calibrate.sh NPROC "MODELS" "PROFILES" "BATCHES" [STEPS]
# Every model x profile x micro batch trains STEPS (default 4) eager steps from scratch at block 1024;
# calibration_rows.py turns the summaries into rows of finetune/calibration.json's form, each beside the
# planner's prediction for it ($OUT/calibration_rows.json, $OUT/calibration_table.md).
N=$1 MODELS=$2 PROFILES=$3 BATCHES=$4 STEPS=${5:-4}
for M in $MODELS; do for P in $PROFILES; do for B in $BATCHES; do
  NAME=$M.$P.b$B.n$N
  COMMAND="accelerate launch --config_file accelerate_configs/$P.yaml --num_processes $N finetune/run.py
    --model $M --from_scratch --max_steps $STEPS --batch_size $B --block_size 1024 --logging_steps 1
    --throughput_warmup_steps 1 --max_eval_samples 2 --save_strategy no --report_to none --disable_tqdm true
    --torch_compile false --profile_memory"
  FINETUNE_PROFILE=$P timeout ${CALIBRATE_TIMEOUT:-240} $COMMAND --output_dir /tmp/cal_$NAME > $OUT/$NAME.log 2>&1
  echo "$NAME rc $?"
  [ -f /tmp/cal_$NAME/run_summary.json ] && cp /tmp/cal_$NAME/run_summary.json $OUT/$NAME.json
  echo "$COMMAND" | tr -s ' \n' ' ' > $OUT/$NAME.command
  rm -rf /tmp/cal_$NAME
done; done; done
python benchmarks/scripts/calibration_rows.py $OUT | tee $OUT/calibration_table.md
