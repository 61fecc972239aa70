#!/bin/bash
# Second call of nvidia-h100-x1 this sitting, from the project root after `source .device/setup.sh`:
# (1) a memory snapshot of gpt2-medium's LoRA step under zero3 (--lora_dropout 0, eager), beside
# call 1's single and fsdp (issue 17 item 7); (2) LoRA rows the planner was not fitted to: gpt2-large
# under single, fsdp and zero3, eager, run.py's default dropout; (3) the ~1B Llama (make_llama.py
# SIZE=1b) under single, fsdp and zero3 on one process at the planner's micro batch for a global batch
# of 32 (issue 18 item 1); (4) gpt2-medium with --global_batch_size 64 (issue 18 item 2). Each step
# is tarred into $OUT as it ends (the device returns at most 8 files a call).
set -u
R=/tmp/r W=/tmp/w DEADLINE=${DEADLINE:-540}
mkdir -p "$R/snapshots" "$R/calibration" "$R/llama-1b" "$R/global_batch" "$W"
step() { if [ "$SECONDS" -lt "$DEADLINE" ]; then "$@"; else echo "skipped after ${SECONDS}s: $*"; fi; }
keep() { tar -C "$R" -czf "$OUT/$1.tgz" "$1"; echo "kept $1 at ${SECONDS}s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python -c "import torch, transformers, accelerate, deepspeed, peft; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__, peft.__version__)"
} > "$OUT/gpu.txt" 2>/dev/null
python - "$W" <<'PY'
import os, sys
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
for name in ("gpt2-medium", "gpt2-large"):
    source = os.path.join(os.environ["FINETUNE_DATA_DIR"], name)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(f"{sys.argv[1]}/{name}")
    AutoTokenizer.from_pretrained(source).save_pretrained(f"{sys.argv[1]}/{name}")
PY
MODEL=$W/gpt2-medium TOOL=memory_snapshot RUN_TIMEOUT=120 step bash benchmarks/run.sh profile --out "$R/snapshots" zero3:--peft,lora,--lora_dropout,0,--torch_compile,false
rm -f "$R"/snapshots/*.pickle; keep snapshots
PEFT=lora CALIBRATE_TIMEOUT=120 step bash benchmarks/run.sh calibrate --out "$R/calibration" 1 "$W/gpt2-large" "single fsdp zero3" 8
keep calibration
SIZE=1b python benchmarks/scripts/make_llama.py "$W/llama-1b" > "$R/llama-1b/make_llama.log" 2>&1
n=0
for P in single fsdp zero3; do
  PROFILE=$P FIRST_INDEX=$n RUN_TIMEOUT=150 step bash benchmarks/run.sh speed --out "$R/llama-1b" "$W/llama-1b" g32 20 finetune; n=$((n+1))
done
keep llama-1b
RUN_TIMEOUT=150 step bash benchmarks/run.sh speed --out "$R/global_batch" gpt2-medium g64 30 finetune
keep global_batch
echo "done in ${SECONDS}s"
