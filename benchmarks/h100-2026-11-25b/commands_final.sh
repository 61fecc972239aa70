#!/bin/bash
# The fourth call of nvidia-h100-x1, from the project root after `source .device/setup.sh`. The raw
# results of calls 2 and 3 were lost with the session's machine before they were copied into the
# project, so this call measures again what this folder's notes claim, writing straight into $OUT:
# (1) single and zero3 from the same weights (step 1's loss, dropout off, eager); (2) a Llama pair,
# plain Trainer then finetune; (3) gpt2-xl's start-up with empty compile caches; (4) memory snapshots
# of gpt2-medium's LoRA step (--lora_dropout 0, eager) under single and fsdp, stacks kept.
set -u
R=${R:-$OUT} W=/tmp/w DEADLINE=${DEADLINE:-420}
mkdir -p "$R/startup" "$R/llama" "$R/same_weights" "$R/snapshots" "$W"
step() { if [ "$SECONDS" -lt "$DEADLINE" ]; then "$@"; else echo "skipped after ${SECONDS}s: $*"; fi; }
source <(sed -n '/^startup()/,/^}/p;/^same_weights()/,/^}/p' benchmarks/h100-2026-11-25b/commands_speed.sh)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt"
step same_weights single
step same_weights zero3
[ -d "$W/llama-0.36b" ] || python benchmarks/scripts/make_llama.py "$W/llama-0.36b" > "$R/make_llama.log" 2>&1
n=0
for V in plain finetune; do
  FIRST_INDEX=$n step bash benchmarks/run.sh speed --out "$R/llama" "$W/llama-0.36b" 8 30 "$V"; n=$((n+1))
done
step startup
[ -d "$W/gpt2-medium" ] || python - "$W/gpt2-medium" <<'PY'
import os, sys
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
source = os.path.join(os.environ["FINETUNE_DATA_DIR"], "gpt2-medium")
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(source).save_pretrained(sys.argv[1])
PY
snapshot() { MODEL=$W/gpt2-medium TOOL=memory_snapshot RUN_TIMEOUT=100 bash benchmarks/run.sh profile --out "$R/snapshots" "$@"; }
step snapshot single:--peft,lora,--lora_dropout,0,--torch_compile,false
step snapshot fsdp:--peft,lora,--lora_dropout,0,--torch_compile,false
rm -f "$R"/snapshots/*.pickle
echo "done in ${SECONDS}s"
