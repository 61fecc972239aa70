#!/bin/bash
# Call 1: CUDA graphs (--torch_compile_mode reduce-overhead) under the ddp, FSDP and ZeRO-2 profiles on
# one process, against each profile's default (compiled blocks, no graphs): gpt2-medium from scratch at
# micro batch 8 x 1024, 30 steps. A sharded step at this size is host-bound (the profiles' host floor,
# h200-2026-11-30b); graphs take the compiled blocks' kernel launches off the host, if FSDP2's
# unsharded parameters keep their addresses between steps (TORCH_LOGS=cudagraphs says whether the
# graphs were recorded again). From the project root after `source .device/setup.sh`; copies
# $OUT/floor.tgz as each case ends, and starts no case after 480 s.
set -u
GRAPHS=--torch_compile_mode,reduce-overhead
for CASE in fsdp "TORCH_LOGS=cudagraphs+fsdp:$GRAPHS" fsdp_grad_op "TORCH_LOGS=cudagraphs+fsdp_grad_op:$GRAPHS" \
    ddp "TORCH_LOGS=cudagraphs+ddp:$GRAPHS" zero2 "TORCH_LOGS=cudagraphs+zero2:$GRAPHS" single; do
  [ "$SECONDS" -ge 480 ] && { echo "stopped before $CASE at ${SECONDS}s"; break; }
  RUN_TIMEOUT=150 bash benchmarks/run.sh floor --out /tmp/graphs gpt2-medium 8 30 "$CASE"
  cp /tmp/graphs/floor.tgz "$OUT/"
done
