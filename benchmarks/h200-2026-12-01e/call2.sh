#!/bin/bash
# Call 2: call 1 again after the forward was fixed to run regional compilation's compiled blocks
# (call 1's forward ran the uncompiled model: 2x slower, not a measure of the lever), then the 1B
# Llama's compiled peaks at micro batch 16 under single, ddp and fsdp, and fsdp's from the tree
# before (.baseline = 1481ab6; call 1 has single's). From the project root after
# `source .device/setup.sh`; everything lands in $OUT/call2.tgz as each part ends.
set -u
R=/tmp/call2; mkdir -p $R
pack() { tar -czf /tmp/call2.tgz -C $R . && cp /tmp/call2.tgz "$OUT/call2.tgz"; }
BASELINE=$PWD/.baseline RUN_TIMEOUT=110 bash benchmarks/run.sh floor --out $R/speed gpt2-medium 32 40 \
  single base/single 'single#r2' 'base/single#r2' 2>&1 | tee $R/speed_lines.txt
pack
SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > $R/make_llama.log 2>&1
COMPILE=1 CALIBRATE_TIMEOUT=100 bash benchmarks/run.sh calibrate --out $R/peak 1 /tmp/llama-1b "single fsdp ddp" 16 2>&1 | tail -6
pack
(cd .baseline && PYTHONPATH=$PWD:$PYTHONPATH COMPILE=1 CALIBRATE_TIMEOUT=100 bash benchmarks/run.sh calibrate \
  --out $R/base_peak 1 /tmp/llama-1b fsdp 16 2>&1 | tail -4)
pack
