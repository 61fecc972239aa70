"""The reference runs: one finished 2-rank run per profile, made once per session and read by every module.

The integration modules all need a tiny run that finished on 2 ranks: its summary and TensorBoard log
(test_integration), the weights and losses a resumed run must end with (test_resume,
test_world_size_change), checkpoints to plant hostile files in (test_hostile_files). Each used to
launch its own with slightly different flags; one run per profile with one set of flags serves them all.
It saves a checkpoint every SAVE_STEPS steps and logs every step, and its model has no dropout, so
a run continued on another number of processes computes the same function (test_world_size_change).

The run's folder is shared: no test writes into it. A test that resumes, damages or exports a
checkpoint copies it into its own tmp_path first (`copy_checkpoint`).

zero2's reference is launched through `finetune run` from a folder outside the checkout, with a
generation prompt, so that entry point is covered without a launch of its own: it runs the same
`accelerate launch` with the same profile, and the prompt is read after training.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from launching import BYTE_GPT2, accelerate_launch, launch, nvme_flags

PROFILES = ("ddp", "fsdp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_nvme")
MAX_STEPS = 20
SAVE_STEPS = 5
CHECKPOINT_STEPS = tuple(range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS))
BLOCK_SIZE = 64
MICRO_BATCH = 4
EVAL_SAMPLES = 16
THROUGHPUT_WARMUP_STEPS = 2
GENERATION_PROMPT = "The history of"
NO_DROPOUT = "resid_pdrop=0,embd_pdrop=0,attn_pdrop=0"
FLAGS = [
    "--model", str(BYTE_GPT2), "--from_scratch",
    "--config_overrides", f"n_layer=2,n_embd=64,n_head=2,{NO_DROPOUT}",
    "--dataset", "wikitext-2-raw-v1", "--block_size", str(BLOCK_SIZE), "--max_steps", str(MAX_STEPS),
    "--batch_size", str(MICRO_BATCH), "--learning_rate", "3e-3", "--max_eval_samples", str(EVAL_SAMPLES),
    "--save_steps", str(SAVE_STEPS), "--logging_steps", "1", "--report_to", "tensorboard",
    "--throughput_warmup_steps", str(THROUGHPUT_WARMUP_STEPS), "--disable_tqdm", "true",
]  # fmt: skip
# For a run compared with a reference run: the same training without checkpoints, which it never reads.
NO_CHECKPOINTS = ["--save_strategy", "no"]


def finetune_run(profile: str) -> list[str]:
    return [sys.executable, "-m", "finetune", "run", "--profile", profile, "--num_processes", "2"]


def make_reference_run(profile: str, output_dir: Path) -> Path:
    if profile == "zero2":
        outside_the_checkout = output_dir.parent
        launch(finetune_run(profile), output_dir, [*FLAGS, "--generation_prompt", GENERATION_PROMPT],
               cwd=outside_the_checkout)  # fmt: skip
    else:
        launch(accelerate_launch(profile), output_dir, [*FLAGS, *nvme_flags(profile, output_dir)])
    return output_dir


def copy_checkpoint(run: Path, destination: Path, step: int) -> Path:
    """A private copy of one of `run`'s checkpoints, as `destination/checkpoint-STEP`."""
    checkpoint = destination / f"checkpoint-{step}"
    shutil.copytree(run / checkpoint.name, checkpoint)
    return checkpoint
