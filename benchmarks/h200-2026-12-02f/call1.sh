#!/bin/bash
# One H200: run.py after its model preparation, end of training and sequence-parallel collator moved
# into their own modules (model_setup.py, after_training.py), checked on a GPU: (a) an instruction run
# with --generation_prompt (GSM8K packed, gpt2 from scratch, the after-training path and its samples);
# (b) gpt2-medium at micro batch 8, 40 steps, under single (whole model compiled), fsdp (block by
# block) and zero3 (its leaf blocks compiled), the tree at HEAD beside the tree before the move
# (.baseline, `git archive f300b43`), alternating, rounds while time is left (one at least; the
# rounds numbered from FIRST_ROUND, 1 by default).
# From the project root, after `source .device/setup.sh`: bash benchmarks/h200-2026-12-02f/call1.sh DIR
R=$1; mkdir -p "$R/runs" "$R/generation"
START=$SECONDS
# which trees ran: the copy's files (its .git may lag the working tree it was copied from)
sha256sum finetune/run.py finetune/model_setup.py finetune/after_training.py .baseline/finetune/run.py \
  > "$R/trees.txt" 2>&1
timeout 150 python -m finetune run --profile single --model gpt2 --from_scratch --dataset gsm8k --max_steps 20 \
  --batch_size 8 --max_eval_samples 16 --save_strategy no --report_to none --disable_tqdm true \
  --generation_prompt "Question: Tom has 3 apples and buys 2 more. How many apples does he have?" \
  --output_dir /tmp/o_generation > "$R/generation/run.log" 2>&1
echo "generation rc $?" >> "$R/generation/run.log"
cp /tmp/o_generation/run_summary.json "$R/generation/" 2>/dev/null
ROOT=$PWD
round=$((${FIRST_ROUND:-1} - 1))
while [ $round -lt ${FIRST_ROUND:-1} ] || [ $((SECONDS - START)) -lt 330 ]; do
  round=$((round + 1))
  for PROFILE in single fsdp zero3; do
    for TREE in head base; do
      DIR=$ROOT; [ $TREE = base ] && DIR=$ROOT/.baseline
      (cd "$DIR" && OUT=$R/runs PROFILE=$PROFILE TAG=$TREE-r$round FIRST_INDEX=0 RUN_TIMEOUT=240 \
        bash $ROOT/benchmarks/scripts/speed.sh gpt2-medium 8 40 finetune) >> "$R/runs/progress.txt" 2>&1
    done
  done
done
echo "rounds $round, $((SECONDS - START)) s" >> "$R/runs/progress.txt"
tar -czf "$R/runs.tgz" -C "$R" runs && rm -rf "$R/runs"
