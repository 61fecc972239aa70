#!/bin/bash
# One GPU, after call 1: LoRA's compiled one-process peaks under fsdp_grad_op, zero1 and zero2 on
# the other two shapes calibration.json had adapters rows for only under single, fsdp and zero3:
# gpt2-large and the 1B Llama at micro batch 8. Two streams at once, as call 1. From the project
# root after `source .device/setup.sh`: bash call2.sh /tmp/c2 (packed into $OUT/c2.tgz every 20 s).
R=$1; mkdir -p "$R"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt"
(while sleep 20; do tar -czf "$OUT/c2.tgz" -C "$(dirname "$R")" "$(basename "$R")"; done) &
PACKER=$!
export CALIBRATE_TIMEOUT=170 COMPILE=1 PEFT=lora
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
llama() {
  SIZE=1b python benchmarks/scripts/make_llama.py /tmp/weights/llama-1b > "$R/make_llama.log" 2>&1
  cal lora_llama8 /tmp/weights/llama-1b "zero1 zero2 fsdp_grad_op" 8
}
large() {
  python benchmarks/scripts/save_initialised.py gpt2-large /tmp/weights/gpt2-large > "$R/save_large.log" 2>&1
  cal lora_large8 /tmp/weights/gpt2-large "zero1 zero2 fsdp_grad_op" 8
}
llama & A=$!
large & B=$!
wait $A $B
kill $PACKER; tar -czf "$OUT/c2.tgz" -C "$(dirname "$R")" "$(basename "$R")"
