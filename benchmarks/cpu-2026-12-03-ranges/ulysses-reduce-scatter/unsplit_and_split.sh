# usage: MODEL=FOLDER bash unsplit_and_split.sh PROFILE.yaml OUT  (absolute paths; run from the project root)
# MODEL: the tests' byte-level 2-layer Llama (tests/conftest.py byte_llama_config_dir) saved to a folder.
# One process unsplit, then two with --sequence_parallel 2 (Ulysses), then the largest weight difference.
set -e
P=$1; OUT=$2
export HF_HUB_OFFLINE=1 FINETUNE_DATA_DIR=${FINETUNE_DATA_DIR:-../shared/data} OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR=$OUT-ext
F="--model $MODEL --from_scratch --batch_size 2 --max_steps 4 --logging_steps 1 --precision fp32 --torch_compile false --learning_rate 1e-3 --save_strategy no --max_eval_samples 4 --report_to none --disable_tqdm true --throughput_warmup_steps 1 --block_size 64"
python -m finetune.launch --config_file $P --num_processes 1 --main_process_port 0 finetune/run.py $F --output_dir $OUT/unsplit > $OUT.unsplit.log 2>&1
python -m finetune.launch --config_file $P --num_processes 2 --main_process_port 0 finetune/run.py $F --sequence_parallel 2 --output_dir $OUT/split > $OUT.split.log 2>&1
python - $OUT <<'PY'
import sys, json
from safetensors.torch import load_file
o = sys.argv[1]
a, b = load_file(o + "/unsplit/model.safetensors"), load_file(o + "/split/model.safetensors")
worst = max(((a[k] - b[k]).abs().max().item(), k) for k in a)
la = [p["loss"] for p in json.load(open(o + "/unsplit/run_summary.json"))["loss_curve"]]
lb = [p["loss"] for p in json.load(open(o + "/split/run_summary.json"))["loss_curve"]]
print("max weight diff", worst, "losses", la, lb)
PY
