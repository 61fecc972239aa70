#!/bin/bash
# The third call of nvidia-h100-x1, from the project root after `source .device/setup.sh`; results under
# $R, packed into $OUT/results.tgz. (1) single and zero3 from the same weights again, with the random
# state forked around the model's build (finetune/models.py); (2) memory snapshots, each live
# allocation's stack kept, of gpt2-medium's LoRA step with --lora_dropout 0 under single and fsdp
# (eager); (3) a second gpt2-xl start-up and a third Llama pair (commands_speed.sh's runs).
set -u
R=${R:-/tmp/r3} W=/tmp/w DEADLINE=${DEADLINE:-480}
mkdir -p "$R/startup" "$R/llama" "$R/same_weights" "$R/snapshots" "$W"
step() { if [ "$SECONDS" -lt "$DEADLINE" ]; then "$@"; else echo "skipped after ${SECONDS}s: $*"; fi; }
source <(sed -n '/^startup()/,/^}/p;/^same_weights()/,/^}/p' benchmarks/h100-2026-11-25b/commands_speed.sh)
[ -d "$W/llama-0.36b" ] || python benchmarks/scripts/make_llama.py "$W/llama-0.36b" > "$R/make_llama.log" 2>&1
[ -d "$W/gpt2-medium" ] || python - "$W/gpt2-medium" <<'PY'
import os, sys
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
source = os.path.join(os.environ["FINETUNE_DATA_DIR"], "gpt2-medium")
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(source).save_pretrained(sys.argv[1])
PY
step same_weights single
step same_weights zero3
snapshot() { MODEL=$W/gpt2-medium TOOL=memory_snapshot RUN_TIMEOUT=100 bash benchmarks/run.sh profile --out "$R/snapshots" "$@"; }
step snapshot single:--peft,lora,--lora_dropout,0,--torch_compile,false
step snapshot fsdp:--peft,lora,--lora_dropout,0,--torch_compile,false
rm -f "$R"/snapshots/*.pickle
step startup
n=5
for V in plain finetune; do
  FIRST_INDEX=$n step bash benchmarks/run.sh speed --out "$R/llama" "$W/llama-0.36b" 8 30 "$V"; n=$((n+1))
done
tar czf "$OUT/results.tgz" -C "$R" .
echo "done in ${SECONDS}s"
