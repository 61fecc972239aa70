#!/bin/bash
# Third call of nvidia-h100-x1 this sitting, from the project root after `source .device/setup.sh`:
# (1) --fp8 against the default on gpt2-xl (micro batch 8) and on the ~1B Llama (micro batch 16), the
# single profile's defaults otherwise, one pair each (issue 18 item 5); (2) what made the 1B Llama
# fail under the single profile in call 2 (CUDA graphs at its first backward with micro batch 16 x
# accumulation 2): the pair in (1) runs micro batch 16 without accumulation, then micro batch 8 x
# accumulation 2 alone; (3) gpt2-medium with --global_batch_size 64 (issue 18 item 2), if time is
# left. Each step is tarred into $OUT as it ends (the device returns at most 8 files a call).
set -u
R=/tmp/r W=/tmp/w DEADLINE=${DEADLINE:-470}
mkdir -p "$R/fp8" "$R/accumulation" "$R/global_batch" "$W"
step() { if [ "$SECONDS" -lt "$DEADLINE" ]; then "$@"; else echo "skipped after ${SECONDS}s: $*"; fi; }
keep() { tar -C "$R" -czf "$OUT/$1.tgz" "$1"; echo "kept $1 at ${SECONDS}s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python -c "import torch, transformers, accelerate, deepspeed, peft, torchao; print(torch.__version__, transformers.__version__, accelerate.__version__, deepspeed.__version__, peft.__version__, torchao.__version__)"
} > "$OUT/gpu.txt" 2>/dev/null
speed() { RUN_TIMEOUT=150 step bash benchmarks/run.sh speed --out "$R/$1" "${@:2}"; }
FIRST_INDEX=0 speed fp8 gpt2-xl 8 25 finetune finetune:--fp8
keep fp8
SIZE=1b python benchmarks/scripts/make_llama.py "$W/llama-1b" > "$R/fp8/make_llama.log" 2>&1
FIRST_INDEX=2 speed fp8 "$W/llama-1b" 16 20 finetune finetune:--fp8
keep fp8
speed accumulation "$W/llama-1b" 8 6 finetune:--gradient_accumulation_steps,2
keep accumulation
speed global_batch gpt2-medium g64 30 finetune
keep global_batch
echo "done in ${SECONDS}s"
