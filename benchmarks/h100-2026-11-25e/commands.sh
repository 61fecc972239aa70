#!/bin/bash
# Issue 18 on one GPU, one model per call: this sitting's calls ran what is now
# `benchmarks/run.sh model_cases` with TAG, RUN_FLAGS and PROFILE_FLAGS unset (the same cases,
# repeats, deadline, profiles and tarring into $OUT/MODEL.tgz; it since also reuses a Llama folder a
# warm machine kept).
# usage (project root, after `source .device/setup.sh`):
#   bash benchmarks/h100-2026-11-25e/commands.sh MODEL CASE...   MODEL: a name, llama-1b or llama-0.36b
exec bash benchmarks/run.sh model_cases --out "$OUT" "$@"
