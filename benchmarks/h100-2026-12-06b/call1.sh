#!/bin/bash
# One GPU: the compiled one-process peaks calibration.json had no row for (issue "Several GPUs,
# proven", target 1's one-GPU part): LoRA under fsdp_grad_op, zero1 and zero2 beyond gpt2-medium, and
# full fine-tuning of gpt2-large under zero2 and of the 0.36B Llama under zero2, zero1 and
# fsdp_grad_op at micro batch 8 and 16. Two streams at once on the one GPU (each peak is its own
# process's torch.cuda.max_memory_allocated; planned together below 70 GiB). From the project root
# after `source .device/setup.sh`: bash call1.sh /tmp/c1 (packed into $OUT/c1.tgz every 20 s).
R=$1; mkdir -p "$R"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt"
(while sleep 20; do tar -czf "$OUT/c1.tgz" -C "$(dirname "$R")" "$(basename "$R")"; done) &
PACKER=$!
export CALIBRATE_TIMEOUT=170 COMPILE=1
cal() { bash benchmarks/run.sh calibrate --out "$R/$1" 1 "$2" "$3" "$4" > "$R/$1.out" 2>&1; }
lora() {  # adapters need saved weights: gpt2-medium's, then gpt2-xl's
  python benchmarks/scripts/save_initialised.py gpt2-medium /tmp/m-init > "$R/save_m.log" 2>&1
  PEFT=lora cal lora_m8 /tmp/m-init fsdp_grad_op 8
  python benchmarks/scripts/save_initialised.py gpt2-xl /tmp/xl-init > "$R/save_xl.log" 2>&1
  PEFT=lora cal lora_xl8 /tmp/xl-init "zero1 zero2 fsdp_grad_op" 8
}
full() {
  cal large8 gpt2-large zero2 8
  python benchmarks/scripts/make_llama.py /tmp/llama-0.36b > "$R/make_llama.log" 2>&1
  cal llama8 /tmp/llama-0.36b zero2 8
  cal llama16 /tmp/llama-0.36b "zero1 zero2 fsdp_grad_op" 16
}
lora & A=$!
full & B=$!
wait $A $B
kill $PACKER; tar -czf "$OUT/c1.tgz" -C "$(dirname "$R")" "$(basename "$R")"
