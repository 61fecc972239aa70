# One-GPU checks of this session (recorded in benchmarks/<gpu>-<date>/NOTES.md).
R=$1; F=$(cat z3flags)
mkdir -p /tmp/z3 && cp -r z3ckpt/checkpoint-5 /tmp/z3/
S=$(date +%s)
timeout 100 accelerate launch --config_file accelerate_configs/zero3.yaml --num_processes 1 finetune/run.py $F --precision fp32 \
  --output_dir /tmp/z3 --resume --allow_world_size_change > $R/zero3_2cpu_to_1gpu.log 2>&1; echo "zero3 2 cpu ranks -> 1 gpu rc $? $(( $(date +%s) - S )) s"
cp /tmp/z3/run_summary.json $R/zero3_2cpu_to_1gpu.json; cp z3ckpt/cpu_summary.json $R/zero3_2cpu_uninterrupted.json
S=$(date +%s)
timeout 170 accelerate launch --config_file accelerate_configs/single.yaml --num_processes 1 finetune/run.py --model gpt2-medium --from_scratch \
  --global_batch_size 64 --max_steps 30 --block_size 1024 --logging_steps 10 --throughput_warmup_steps 5 --max_eval_samples 16 \
  --save_strategy no --report_to none --disable_tqdm true --output_dir /tmp/gbs > $R/gpt2-medium.gbs64.log 2>&1; echo "gbs64 rc $? $(( $(date +%s) - S )) s"
cp /tmp/gbs/run_summary.json $R/gpt2-medium.gbs64.json
timeout 90 python benchmarks/scripts/plain_trainer.py $FINETUNE_DATA_DIR/gpt2-medium 8 30 $R/plain.gpt2-medium.b8.json > $R/plain.gpt2-medium.b8.log 2>&1; echo "plain rc $?"
S=$(date +%s)
timeout 190 accelerate launch --config_file accelerate_configs/single.yaml --num_processes 1 finetune/run.py --model gpt2-xl --from_scratch \
  --batch_size 8 --max_steps 8 --block_size 1024 --logging_steps 2 --throughput_warmup_steps 3 --max_eval_samples 8 \
  --save_strategy no --report_to none --disable_tqdm true --output_dir /tmp/xl > $R/gpt2-xl.startup.log 2>&1; echo "xl rc $? $(( $(date +%s) - S )) s"
cp /tmp/xl/run_summary.json $R/gpt2-xl.startup.json
python - $R <<'PY'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    s = json.load(open(p))
    keys = ("status", "error", "world_size", "resumed_from_step", "steps", "eval_loss", "batch_choice", "micro_batch_size",
            "gradient_accumulation_steps", "tokens_per_second_per_device", "tokens_per_second", "mfu", "time_to_first_step_s",
            "memory_peak_allocated_gib_max", "peak_allocated_gib", "torch_compile")
    print(p.name, {k: s[k] for k in keys if k in s})
PY
