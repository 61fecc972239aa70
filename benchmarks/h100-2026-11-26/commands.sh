#!/bin/bash
# This folder's calls ran `bash benchmarks/h100-2026-11-26/commands.sh MODEL CASE...` (NOTES.md lists
# each with its TAG, RUN_FLAGS and PROFILE_FLAGS); that script is now the named command
# `bash benchmarks/run.sh model_cases --out DIR MODEL CASE...` (benchmarks/scripts/model_cases.sh).
exec bash benchmarks/run.sh model_cases --out "$OUT" "$@"
