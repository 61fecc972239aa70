#!/bin/bash
# The one entry point of the GPU benchmarks: bash benchmarks/run.sh COMMAND --out DIR [ARGS...]
# Runs from the project root wherever it is called from; every script writes its results under DIR
# (the scripts read it as $OUT). benchmarks/README.md says what each command measures.
set -uo pipefail
usage() {
  cat <<'USAGE'
usage: bash benchmarks/run.sh COMMAND --out DIR [ARGS...]
  speed MODEL BATCH STEPS VARIANT...   one GPU: plain Trainer baseline and/or run.py variants
  cases STEPS CASE...                  one GPU: named profile cases (see benchmarks/scripts/cases.sh)
  model_cases MODEL CASE...            one GPU: cases at a global batch, then profiles, tarred as each ends
  largest NPROC PROFILE SHAPE [STEPS]  train a `finetune plan --largest` shape beside its prediction
  metrics NPROC PROFILE...             run metrics beside an independent memory sampler and nvidia-smi
  resume NPROC PROFILE...              train, SIGTERM, resume, export, eval, generate
  resume_matches NPROC PROFILE...      uninterrupted vs SIGTERM+resume vs resumed on NPROC/2 (loss table)
  two_launchers NPROC PROFILE...       2 x NPROC processes from one launcher vs two (--num_machines 2)
  several_gpus CALL                    one device call's cases on a 4-GPU machine (scripts/several_gpus.sh)
  floor MODEL BATCH STEPS CASE...      all GPUs: run/trace/plain cases of a profile, levers as flags or env
  long_context MODEL NPROC DEGREE BLOCK...  the longest block that trains unsplit and --sequence_parallel DEGREE
                                       (PROFILE=fsdp: ring attention; zero3, Ulysses, by default)
  calibrate NPROC MODELS PROFILES BATCHES [STEPS]  planner calibration rows beside the planner's predictions
  profile CASE...                      torch.profiler around steps 9-11 of run.py per PROFILE[:flags]
                                       (TOOL=memory_snapshot: what is alive at the first steps' memory peak;
                                       TOOL=allocation_census, CPU: live and peak allocations per step)
  attention                            causal attention fwd+bwd per SDPA backend
  levers MODEL_DIR                     output-layer matmuls and compiled/chunked loss variants
  grad_check MODEL_DIR                 gradient norms of eager/compiled x own/chunked loss
  instruction_lora                     one GPU: GSM8K packed vs a plain padded Trainer; LoRA vs Trainer + peft
  lora_levers                          one GPU: LoRA variants and full fine-tuning beside Trainer + peft, profiled
  float8_census [MODEL...]             CPU: what --fp8 changes in what compiled blocks save for backward
USAGE
}
COMMAND=${1:-help}
[ $# -gt 0 ] && shift
case $COMMAND in help|-h|--help) usage; exit 0 ;; esac
if [ "${1:-}" != --out ] || [ -z "${2:-}" ]; then
  echo "benchmarks/run.sh: $COMMAND needs --out DIR" >&2; usage >&2; exit 2
fi
mkdir -p "$2" && OUT=$(cd "$2" && pwd) && export OUT
shift 2
SCRIPTS=benchmarks/scripts
cd "$(dirname "$0")/.."
case $COMMAND in
  speed) exec bash $SCRIPTS/speed.sh "$@" ;;
  cases) exec bash $SCRIPTS/cases.sh "$@" ;;
  model_cases) exec bash $SCRIPTS/model_cases.sh "$@" ;;
  largest) exec bash $SCRIPTS/largest.sh "$@" ;;
  metrics) exec bash $SCRIPTS/check_metrics.sh "$@" ;;
  resume) exec bash $SCRIPTS/check_resume.sh "$@" ;;
  resume_matches) exec bash $SCRIPTS/resume_matches.sh "$@" ;;
  two_launchers) exec bash $SCRIPTS/two_launchers.sh "$@" ;;
  several_gpus) exec bash $SCRIPTS/several_gpus.sh "$@" ;;
  floor) exec bash $SCRIPTS/floor.sh "$@" ;;
  long_context) exec bash $SCRIPTS/long_context.sh "$@" ;;
  calibrate) exec bash $SCRIPTS/calibrate.sh "$@" ;;
  profile) exec bash $SCRIPTS/profile_cases.sh "$@" ;;
  attention) exec python $SCRIPTS/attention.py "$OUT/attention.json" ;;
  levers) exec python $SCRIPTS/levers.py "${1:?MODEL_DIR}" "$OUT" ;;
  grad_check) exec python $SCRIPTS/grad_check.py "${1:?MODEL_DIR}" "$OUT/grad_check.json" ;;
  instruction_lora) exec bash $SCRIPTS/instruction_lora.sh "$@" ;;
  lora_levers) exec bash $SCRIPTS/lora_levers.sh "$@" ;;
  float8_census) exec python $SCRIPTS/float8_census.py "$OUT" "$@" ;;
  *) echo "benchmarks/run.sh: unknown command '$COMMAND'" >&2; usage >&2; exit 2 ;;
esac
