#!/bin/bash
# Planner calibration runs. usage: bash benchmarks/scripts/calibrate.sh NPROC "MODELS" "PROFILES" "BATCHES" [STEPS]
# Every model x profile x micro batch trains STEPS (default 4) eager steps at block 1024, from scratch for
# a model name, from the weights saved there for a model folder; PEFT=lora|dora trains adapters on such
# a folder's weights (peft refuses random ones: `finetune run` asks for a saved model), COMPILE=1 runs
# compiled as run.py's default does, EXTRA adds run.py flags and TAG names them in the file names (e.g.
# EXTRA="--lora_dropout 0" TAG=dropout0). calibration_rows.py turns the summaries into rows of
# finetune/calibration.json's form ($OUT/calibration_rows.json); `tables.py peaks` shows each beside the
# planner's prediction for it ($OUT/calibration_table.md).
N=$1 MODELS=$2 PROFILES=$3 BATCHES=$4 STEPS=${5:-4}
COMPILE_FLAGS=(--torch_compile false) ADAPTER_FLAGS=() KIND=
[ "${COMPILE:-0}" = 1 ] && COMPILE_FLAGS=() KIND=.compiled
[ -n "${PEFT:-}" ] && ADAPTER_FLAGS=(--peft "$PEFT")
for M in $MODELS; do for P in $PROFILES; do for B in $BATCHES; do
  SOURCE=(--from_scratch)
  [ -d "$M" ] && SOURCE=()
  NAME=$(basename "$M").$P.b$B.n$N${PEFT:+.$PEFT}$KIND${TAG:+.$TAG}
  COMMAND="accelerate launch --config_file accelerate_configs/$P.yaml --num_processes $N --main_process_port 0 finetune/run.py
    --model $M ${SOURCE[*]} ${ADAPTER_FLAGS[*]} --max_steps $STEPS --batch_size $B --block_size 1024
    --logging_steps 1 --throughput_warmup_steps 1 --max_eval_samples 2 --save_strategy no --report_to none
    --disable_tqdm true ${COMPILE_FLAGS[*]} ${EXTRA:-} --profile_memory"
  FINETUNE_PROFILE=$P timeout ${CALIBRATE_TIMEOUT:-240} $COMMAND --output_dir /tmp/cal_$NAME > $OUT/$NAME.log 2>&1
  echo "$NAME rc $?"
  [ -f /tmp/cal_$NAME/run_summary.json ] && cp /tmp/cal_$NAME/run_summary.json $OUT/$NAME.json
  echo "$COMMAND" | tr -s ' \n' ' ' > $OUT/$NAME.command
  rm -rf /tmp/cal_$NAME
done; done; done
python benchmarks/scripts/calibration_rows.py $OUT
python benchmarks/scripts/tables.py peaks $OUT | tee $OUT/calibration_table.md
