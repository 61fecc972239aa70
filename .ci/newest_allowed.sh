#!/usr/bin/env bash
# What a user's `pip install .` gets: the newest versions setup.cfg's ranges allow, no constraints, in a
# venv of its own, then the quick start from a folder outside the checkout (profiles, plan, a CPU run),
# then the whole suite on those versions (an editable install over the same venv, as the suite expects),
# less zero3_nvme's runs when DeepSpeed is the pinned version (below).
# usage: bash .ci/newest_allowed.sh VENV_DIR   (from the project root; FINETUNE_DATA_DIR set)
set -euo pipefail
VENV=$1
ROOT=$(pwd)
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0                  # the CPU build, as .ci/run installs it
"$VENV/bin/pip" install -q .
"$VENV/bin/pip" freeze | grep -iE '^(torch|transformers|accelerate|deepspeed|datasets|peft|huggingface.hub)=' \
    | tr '\n' ' ' | sed 's/^/ci: newest allowed: /'; echo
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export HF_HUB_OFFLINE=1 FINETUNE_DATA_DIR
FINETUNE_DATA_DIR=$(cd "$ROOT" && cd "$FINETUNE_DATA_DIR" && pwd)
"$VENV/bin/finetune" profiles > /dev/null
"$VENV/bin/finetune" plan --model gpt2-medium --gpus 4 --gpu_memory 80 > /dev/null
"$VENV/bin/finetune" run --profile single "$ROOT/recipes/cpu_quickstart.yaml" --max_steps 5 \
    --max_eval_samples 8 --output_dir "$WORK/quickstart" --report_to none > "$WORK/run.log" 2>&1 \
    || { tail -20 "$WORK/run.log"; exit 1; }
python3 -c "import json, sys; s = json.load(open(sys.argv[1])); assert s['status'] == 'completed', s['status']" \
    "$WORK/quickstart/run_summary.json"
echo "ci: the newest allowed versions install and run the quick start"

# The suite's SLURM jobs start `finetune` from PATH: the venv is activated, not only its python named.
cd "$ROOT"
"$VENV/bin/pip" install -q -e ".[dev]"
. "$VENV/bin/activate"
# zero3_nvme's runs differ from zero3_offload's only inside DeepSpeed (its swap through async I/O): with
# the very DeepSpeed the pinned suite ran them on, they are left out here, and the op's compile with them.
PINNED_DEEPSPEED=$(sed -n 's/^deepspeed==//p' .ci/constraints.txt)
if [ "$(python -c 'import importlib.metadata as m; print(m.version("deepspeed"))')" = "$PINNED_DEEPSPEED" ]; then
    export FINETUNE_TESTS_WITHOUT_NVME="deepspeed $PINNED_DEEPSPEED is the pinned version: its NVMe runs passed above"
fi
DS_ACCELERATOR=cpu python .ci/deepspeed_ops.py
echo "ci: $(date -u +%T) the suite on the newest allowed versions"
python -m pytest tests
