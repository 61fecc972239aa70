#!/bin/bash
# Call 1: compiled peaks on one process where calibration.json has no row (the planner's band for the
# profiles as run by default): gpt2-xl under zero1 and zero2 at micro batch 8 and 32, fsdp_grad_op at
# 32, each 4 steps with --profile_memory (calibrate.sh). From the project root after `source
# .device/setup.sh`; tars $OUT/cal-xl.tgz after each invocation, and starts none after 450 s.
set -u
for ARGS in "zero1 8" "zero2 8" "zero1 32" "zero2 32" "fsdp_grad_op 32"; do
  [ "$SECONDS" -ge 450 ] && { echo "stopped before $ARGS at ${SECONDS}s"; break; }
  set -- $ARGS
  CALIBRATE_TIMEOUT=150 COMPILE=1 bash benchmarks/run.sh calibrate --out /tmp/cal-xl 1 gpt2-xl "$1" "$2"
  tar -czf "$OUT/cal-xl.tgz" -C /tmp cal-xl
done
