"""The layout of a run's output_dir, owned here: every file and folder a run writes into it, by name.

Modules that write or read one ask here for its name, and `RESULT_PATTERNS` (what
`--overwrite_output_dir` removes and what makes a later run refuse the folder) is built from the same
names, so a new kind of file is added in one place and the folder rules cover it.

    output_dir/
      run_summary.json          the run's record (finetune/summary.py)
      .finetune.lock            held by rank 0 while the run lives (finetune/outputs.py)
      checkpoint-N/             published by one rename from .staging/ (finetune/checkpoint.py),
        finetune_checkpoint.json  with its manifest: identity, step, file sizes and hashes
      universal-checkpoint-N/   a ZeRO checkpoint converted for a world-size change (finetune/reshard.py)
      runs/RUN_NAME/            TensorBoard (finetune/reporting.py)
      hang-stepN/               every rank's stack when the watchdog ended the run (finetune/watchdog.py)
      doctor.json               `finetune doctor`'s table (finetune/doctor.py)
      .replaced/                an earlier run's results that --overwrite_output_dir set aside: deleted
                                at the new run's first step, put back if it stops before (finetune/outputs.py)
      .launch/PROFILE.yaml      the profile `finetune run` launched with, as its printed command names it
      .launch/ready-WHAT-PID-START@HOST   a machine's first rank's word that WHAT (dataset preparation)
                                is done, for the machine's other ranks (finetune/slow_work.py)
      model.safetensors, config.json, tokenizer files, adapter_*   the final model, written into
                                .staging/final-model/ and moved in file by file (finetune/export.py)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SUMMARY_FILE = "run_summary.json"
LOCK_FILE = ".finetune.lock"
STAGING_DIR = ".staging"
REPLACED_DIR = ".replaced"
FINAL_MODEL_STAGING = "final-model"  # under STAGING_DIR: a save that fails there leaves the folder as it was
CHECKPOINT_PREFIX = "checkpoint-"  # transformers' PREFIX_CHECKPOINT_DIR and its dash
CHECKPOINT_PATTERN = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")
MANIFEST = "finetune_checkpoint.json"
UNIVERSAL_PREFIX = "universal-"  # not "checkpoint-*": neither resumed from nor rotated as a checkpoint
LOGS_DIR = "runs"
HANG_PREFIX = "hang-step"
# Written by `finetune doctor` before `run --doctor` claims the folder: not a result that refuses it.
DOCTOR_REPORT = "doctor.json"
# Written by `finetune run` before launching (finetune/commands/run.py): how the run was launched,
# not a result.
LAUNCH_DIR = ".launch"
# In LAUNCH_DIR: a launch's word to the other ranks of its machine, named by the launcher's PID and start
# and the machine's name ("@" is in no host name), so that no other launch or machine takes it as its own.
READY_MARKER = "ready-{what}-{pid}-{started}@{host}"
MODEL_FILES = (
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model*.bin",
    "adapter_config.json",
    "adapter_model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
# peft writes a model card beside the adapters it saves; a README.md is a result only beside them.
ADAPTER_CARD = "README.md"
# Everything a run writes into output_dir: what --overwrite_output_dir removes, and what makes a later
# run refuse the folder without it. A file left behind would be read as this run's: a stale adapter by
# `from_pretrained`, a stale universal checkpoint by a later world-size change.
RESULT_PATTERNS = (
    SUMMARY_FILE,
    f"{CHECKPOINT_PREFIX}*",
    f"{UNIVERSAL_PREFIX}{CHECKPOINT_PREFIX}*",
    STAGING_DIR,
    *MODEL_FILES,
    LOGS_DIR,
    f"{HANG_PREFIX}*",
)


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"{CHECKPOINT_PREFIX}{step}"


def universal_dir(checkpoint: Path) -> Path:
    return checkpoint.with_name(UNIVERSAL_PREFIX + checkpoint.name)


def logging_dir(output_dir: str | Path, run_name: str) -> str:
    return os.path.join(output_dir, LOGS_DIR, run_name)


def hang_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"{HANG_PREFIX}{step}"


def ready_marker_folder(output_dir: str | Path) -> Path:
    return Path(output_dir) / LAUNCH_DIR
