# One GPU: start-up and speed of whole-graph against block-by-block (regional) compilation, each run
# with an empty inductor/triton cache of its own.
R=$1
run() {  # NAME TIMEOUT MODEL STEPS [LAUNCH FLAGS...]
  local NAME=$1 T=$2 MODEL=$3 STEPS=$4; shift 4
  local S=$(date +%s)
  TORCHINDUCTOR_CACHE_DIR=/tmp/ic_$NAME TRITON_CACHE_DIR=/tmp/tc_$NAME timeout $T accelerate launch \
    --config_file accelerate_configs/single.yaml "$@" finetune/run.py --model $MODEL --from_scratch \
    --batch_size 8 --max_steps $STEPS --block_size 1024 --logging_steps 5 --throughput_warmup_steps 5 \
    --max_eval_samples 8 --save_strategy no --report_to none --disable_tqdm true --output_dir /tmp/o_$NAME \
    > $R/$NAME.log 2>&1
  echo "$NAME rc $? wall $(( $(date +%s) - S )) s"
  cp /tmp/o_$NAME/run_summary.json $R/$NAME.json 2>/dev/null
}
run gpt2-xl.regional 200 gpt2-xl 25 --dynamo_use_regional_compilation
run gpt2-medium.regional 120 gpt2-medium 40 --dynamo_use_regional_compilation
run gpt2-medium.whole 150 gpt2-medium 40
run gpt2-xl.whole 280 gpt2-xl 25
python - $R <<'PY'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    s = json.load(open(p))
    keys = ("status", "torch_compile", "torch_compile_regional", "time_to_first_step_s", "tokens_per_second_per_device",
            "mfu", "step_time_median_s", "step_time_p90_s", "memory_peak_allocated_gib_max")
    print(p.name, {k: s.get(k) for k in keys}, [round(x["loss"], 2) for x in s.get("loss_curve", [])])
PY
