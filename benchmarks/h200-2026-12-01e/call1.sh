#!/bin/bash
# Call 1: training forwards without logits (accelerate's fp32 copy of them gone) against the tree
# before (.baseline = 1481ab6): gpt2-medium single at micro batch 32, alternating, twice each, then the
# 1B Llama's compiled single peak at 16 from both trees. Run from the project root after
# `source .device/setup.sh`; everything lands in $OUT/call1.tgz as each part ends.
set -u
R=/tmp/call1; mkdir -p $R
pack() { tar -czf /tmp/call1.tgz -C $R . && cp /tmp/call1.tgz "$OUT/call1.tgz"; }
git rev-parse HEAD > $R/commit.txt 2>&1
BASELINE=$PWD/.baseline RUN_TIMEOUT=110 bash benchmarks/run.sh floor --out $R/speed gpt2-medium 32 40 \
  single base/single 'single#r2' 'base/single#r2' 2>&1 | tee $R/speed_lines.txt
pack
SIZE=1b python benchmarks/scripts/make_llama.py /tmp/llama-1b > $R/make_llama.log 2>&1
COMPILE=1 CALIBRATE_TIMEOUT=100 bash benchmarks/run.sh calibrate --out $R/peak 1 /tmp/llama-1b single 16 2>&1 | tail -5
pack
(cd .baseline && PYTHONPATH=$PWD:$PYTHONPATH COMPILE=1 CALIBRATE_TIMEOUT=100 bash benchmarks/run.sh calibrate \
  --out $R/base_peak 1 /tmp/llama-1b single 16 2>&1 | tail -5)
pack
