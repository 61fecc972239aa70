#!/bin/bash
# Call 2: the rest of one process's missing compiled peaks (call 1's form; call 1 ended at its 560 s
# during gpt2-xl zero2 at 32, as each case there took 2-2.5 min with calibrate.sh's tables after it):
# gpt2-xl under zero2 and fsdp_grad_op at 32, the 1B Llama (make_llama.py) under the same at 32, then
# gpt2-medium under zero2 at 16; one calibrate.sh per model, $OUT/cal-rest.tgz packed every 20 s.
set -u
mkdir -p /tmp/cal-rest
(while sleep 20; do tar -czf "$OUT/cal-rest.tgz.part" -C /tmp cal-rest && mv "$OUT/cal-rest.tgz.part" "$OUT/cal-rest.tgz"; done) &
SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > /dev/null
for ARGS in "gpt2-xl 32" "/tmp/llama-1b 32"; do
  set -- $ARGS
  CALIBRATE_TIMEOUT=150 COMPILE=1 bash benchmarks/run.sh calibrate --out /tmp/cal-rest 1 "$1" "zero2 fsdp_grad_op" "$2"
done
CALIBRATE_TIMEOUT=100 COMPILE=1 bash benchmarks/run.sh calibrate --out /tmp/cal-rest 1 gpt2-medium zero2 16
kill %1; tar -czf "$OUT/cal-rest.tgz" -C /tmp cal-rest
