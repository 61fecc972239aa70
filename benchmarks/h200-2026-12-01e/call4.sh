#!/bin/bash
# Call 4: the training forward without logits under fsdp and ddp (one process each: FSDP2 on one
# rank; ddp without DDP), gpt2-medium at 32 x 1024, this tree against .baseline (1481ab6), once each,
# one case a floor call so that a call cut short keeps what ended ($OUT/call4.tgz).
set -u
for C in fsdp base/fsdp ddp base/ddp; do
  BASELINE=$PWD/.baseline RUN_TIMEOUT=70 bash benchmarks/run.sh floor --out /tmp/call4 gpt2-medium 32 30 "$C" 2>&1 | tail -1
  cp /tmp/call4/floor.tgz "$OUT/call4.tgz"
done
