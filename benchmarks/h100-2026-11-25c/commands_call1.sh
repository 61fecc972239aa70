#!/bin/bash
# First call of nvidia-h100-x1 this sitting, from the project root after `source .device/setup.sh`:
# (1) memory snapshots of gpt2-medium's LoRA step (--lora_dropout 0, eager) under single and fsdp,
# for issue 17 item 7; (2) two Llama pairs, plain Trainer then finetune (issue 18 item 3); (3)
# gpt2-xl's start-up with empty compile caches on this machine (issue 18 item 4). The device returns
# at most 8 files a call: each step is tarred into $OUT as it ends.
set -u
R=/tmp/r W=/tmp/w DEADLINE=${DEADLINE:-540}
mkdir -p "$R/startup" "$R/llama" "$R/snapshots" "$W"
step() { if [ "$SECONDS" -lt "$DEADLINE" ]; then "$@"; else echo "skipped after ${SECONDS}s: $*"; fi; }
keep() { tar -C "$R" -czf "$OUT/$1.tgz" "$1"; echo "kept $1 at ${SECONDS}s"; }
source <(sed -n '/^startup()/,/^}/p' benchmarks/h100-2026-11-25b/commands_speed.sh)
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python -c "import torch, transformers, accelerate, deepspeed, peft; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__, peft.__version__)"
} > "$OUT/gpu.txt" 2>/dev/null
python - > "$OUT/torchao_check.txt" 2>&1 <<'PY'
import torch, torchao
from torchao.float8 import convert_to_float8_training
m = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048)).cuda().bfloat16()
convert_to_float8_training(m)
y = torch.compile(m)(torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16))
y.float().pow(2).mean().backward()
print("torchao", torchao.__version__, "float8 forward+backward on", torch.cuda.get_device_name(), "ok")
PY
python - "$W/gpt2-medium" <<'PY'
import os, sys
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
source = os.path.join(os.environ["FINETUNE_DATA_DIR"], "gpt2-medium")
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(source).save_pretrained(sys.argv[1])
PY
snapshot() { MODEL=$W/gpt2-medium TOOL=memory_snapshot RUN_TIMEOUT=100 bash benchmarks/run.sh profile --out "$R/snapshots" "$@"; }
step snapshot single:--peft,lora,--lora_dropout,0,--torch_compile,false
step snapshot fsdp:--peft,lora,--lora_dropout,0,--torch_compile,false
rm -f "$R"/snapshots/*.pickle; keep snapshots
python benchmarks/scripts/make_llama.py "$W/llama-0.36b" > "$R/llama/make_llama.log" 2>&1
pair() { n=$1; for V in plain finetune; do FIRST_INDEX=$n step bash benchmarks/run.sh speed --out "$R/llama" "$W/llama-0.36b" 8 30 "$V"; n=$((n+1)); done; }
pair 0; keep llama
step startup; keep startup
pair 2; keep llama
echo "done in ${SECONDS}s"
