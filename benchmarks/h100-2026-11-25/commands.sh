#!/bin/bash
# One call of nvidia-h100-x1, from the project root after `source .device/setup.sh`; $OUT is the call's
# output folder. (1) Planner rows for LoRA (issue 17 item 7): run.py --peft lora on saved random bases,
# gpt2-medium and make_llama.py's 0.36B Llama, under single, zero3 and fsdp on one process, eager, and
# the single profile compiled as it runs by default; (2) GSM8K packed at micro batch 8 beside the plain
# padded script at 16 (issue 17 item 8), as instruction_lora.sh runs them.
set -u
W=/tmp/w
mkdir -p "$W" "$OUT/calibration" "$OUT/gsm8k"
python benchmarks/scripts/make_llama.py "$W/llama-0.36b" > "$OUT/calibration/make_llama.log" 2>&1
python - "$W/gpt2-medium" <<'PY'
import os, sys
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
source = os.path.join(os.environ["FINETUNE_DATA_DIR"], "gpt2-medium")
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(source).save_pretrained(sys.argv[1])
PY
python -c "import torch, transformers, accelerate, deepspeed, peft
print(f'torch {torch.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}, '
      f'deepspeed {deepspeed.__version__}, peft {peft.__version__}')" > "$OUT/calibration/versions.txt"
PEFT=lora CALIBRATE_TIMEOUT=100 bash benchmarks/run.sh calibrate --out "$OUT/calibration" 1 \
  "$W/gpt2-medium $W/llama-0.36b" "single zero3 fsdp" 8
PEFT=lora COMPILE=1 CALIBRATE_TIMEOUT=120 bash benchmarks/run.sh calibrate --out "$OUT/calibration" 1 \
  "$W/llama-0.36b" single 8
OUT=$OUT/gsm8k STEPS=40 BLOCK=1024 LOG_EVERY=10 RUN_TIMEOUT=110 WORK=$W
source benchmarks/scripts/one_gpu_runs.sh
plain plain_instruction.gpt2-medium.b16.run1 plain_instruction.py "$FINETUNE_DATA_DIR/gpt2-medium" 16
project finetune_instruction.gpt2-medium.b8.run1 --model gpt2-medium --from_scratch --dataset gsm8k --batch_size 8
python benchmarks/scripts/tables.py instruction_lora "$OUT" | tee "$OUT/instruction_table.md"
