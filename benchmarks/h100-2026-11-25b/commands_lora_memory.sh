#!/bin/bash
# One call of nvidia-h100-x1, from the project root after `source .device/setup.sh`; $OUT is the call's
# output folder. Issue 17 item 7, what a LoRA step keeps at its peak: memory snapshots of gpt2-medium's
# LoRA step under single and fsdp (eager; 5 GiB apart in benchmarks/h100-2026-11-25/calibration) and
# zero3, and the planner rows again with --lora_dropout 0, for gpt2-medium and make_llama.py's 0.36B
# Llama (random bases saved with weights, as peft refuses a model without). Steps are skipped once the
# call has run DEADLINE seconds, so that what ran comes back. ONLY=snapshots runs the snapshots alone (the
# first call's snapshots failed on a missing --out; the second call ran them).
set -u
W=/tmp/w DEADLINE=${DEADLINE:-500}
mkdir -p "$W" "$OUT/snapshots" "$OUT/calibration_dropout0"
step() { if [ "$SECONDS" -lt "$DEADLINE" ]; then "$@"; else echo "skipped after ${SECONDS}s: $*"; fi; }
[ -d "$W/llama-0.36b" ] || python benchmarks/scripts/make_llama.py "$W/llama-0.36b" > "$OUT/make_llama.log" 2>&1
[ -d "$W/gpt2-medium" ] || python - "$W/gpt2-medium" <<'PY'
import os, sys
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
source = os.path.join(os.environ["FINETUNE_DATA_DIR"], "gpt2-medium")
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(source).save_pretrained(sys.argv[1])
PY
python -c "import torch, transformers, accelerate, deepspeed, peft
print(f'torch {torch.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}, '
      f'deepspeed {deepspeed.__version__}, peft {peft.__version__}')" | tee "$OUT/versions.txt" \
  > "$OUT/calibration_dropout0/versions.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
snapshot() { MODEL=$W/gpt2-medium TOOL=memory_snapshot RUN_TIMEOUT=100 bash benchmarks/run.sh profile --out "$OUT/snapshots" "$@"; }
dropout0() { PEFT=lora EXTRA="--lora_dropout 0" TAG=dropout0 CALIBRATE_TIMEOUT=100 \
  bash benchmarks/run.sh calibrate --out "$OUT/calibration_dropout0" 1 "$1" "$2" 8; }
step snapshot single:--peft,lora,--torch_compile,false
step snapshot fsdp:--peft,lora,--torch_compile,false
if [ "${ONLY:-}" != snapshots ]; then
  for M in gpt2-medium llama-0.36b; do for P in single fsdp zero3; do step dropout0 "$W/$M" $P; done; done
fi
step snapshot zero3:--peft,lora
rm -f "$OUT"/snapshots/*.pickle  # the raw snapshots are too large to bring back; the .json tables stay
[ "${ONLY:-}" = snapshots ] \
  || python benchmarks/scripts/calibration_rows.py "$OUT/calibration_dropout0" > "$OUT/calibration_dropout0/calibration_table.md"
echo "done in ${SECONDS}s"
