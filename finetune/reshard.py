"""`--resume --allow_world_size_change`: continue a checkpoint on a different number of processes.

The run stays the same run: the global batch (micro batch x accumulation x processes) is kept by
changing the gradient accumulation, so every optimizer step sees the same samples as before (the
sampler's order depends on the seed only, and each step takes the next global batch of it), the
Trainer skips the same number of samples, and the LR schedule continues from the loaded scheduler.
The micro batch is kept: it is what fits in device memory and part of the checkpoint's recorded
identity (finetune/resume.py tolerates a different world size and accumulation only). A number of
processes that cannot keep the global batch that way is refused with one line.

What is loaded depends on the strategy:
- DDP and single: the full optimizer state and weights load on any number of processes.
- FSDP2: torch.distributed.checkpoint reshards the saved DTensors onto the new mesh when loading.
- ZeRO-1/2/3: DeepSpeed refuses optimizer partitions written by another number of processes, so the
  checkpoint is converted with DeepSpeed's universal checkpoint (`ds_to_universal`) into a new folder
  beside it and loaded with `"checkpoint": {"load_universal": true}`. The original is not modified.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.utils import logging

from finetune.checkpoint import checkpoint_problem, read_manifest, write_manifest
from finetune.errors import FinetuneError
from finetune.launched import BatchGeometry, Launch
from finetune.run_folder import MANIFEST, STAGING_DIR, universal_dir

logger = logging.get_logger("finetune")

DEEPSPEED_LATEST = "latest"


def saved_world_size(checkpoint: Path) -> int:
    """The Trainer writes one RNG state per process (`rng_state.pth` when there was one)."""
    return len(list(checkpoint.glob("rng_state_*.pth"))) or 1


def checkpoint_geometry(checkpoint: Path, current_accumulation: int) -> BatchGeometry:
    """How the run that wrote `checkpoint` batched, from its manifest's "run" entry (finetune/resume.py).

    A checkpoint from before that entry existed tells its world size by its RNG files and its micro
    batch by trainer_state.json; its accumulation is nowhere outside the pickled training_args.bin,
    which is never unpickled, so the accumulation of the command being resumed is taken for it.
    """
    run = read_manifest(checkpoint).get("run")
    if run is not None:
        processes = run.get("data_parallel_size", run["world_size"])
        return BatchGeometry(run["micro_batch_size"], run["gradient_accumulation_steps"], processes)
    state = json.loads((checkpoint / TRAINER_STATE_NAME).read_text())
    return BatchGeometry(state["train_batch_size"], current_accumulation, saved_world_size(checkpoint))


def deepspeed_tag(checkpoint: Path) -> str | None:
    """The DeepSpeed checkpoint inside a Trainer checkpoint (`global_stepN`), or None if it has none."""
    latest = checkpoint / DEEPSPEED_LATEST
    return latest.read_text().strip() if latest.is_file() else None


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def convert_to_universal(checkpoint: Path, tag: str) -> Path:
    """Write `universal-checkpoint-N` beside `checkpoint`: its Trainer files, linked (or copied where
    links are refused), and its DeepSpeed state converted by `ds_to_universal`, whole or not at all.

    Written by hand around DeepSpeed's converter: it converts one `global_stepN` folder, while the
    Trainer resumes from the folder around it (trainer state, scheduler, RNG), which no library
    copies. A universal folder already converted (a requeued resume) is used again.
    """
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    target = universal_dir(checkpoint)
    if target.is_dir() and checkpoint_problem(target) is None:
        return target
    staged = checkpoint.parent / STAGING_DIR / target.name
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(
        checkpoint,
        staged,
        ignore=shutil.ignore_patterns(tag, DEEPSPEED_LATEST, MANIFEST),
        copy_function=_link_or_copy,
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        ds_to_universal(
            argparse.Namespace(
                input_folder=str(checkpoint / tag),
                output_folder=str(staged / tag),  # it also writes staged/latest_universal, naming the tag
                num_extract_workers=1,
                num_merge_workers=1,
                keep_temp_folder=False,
                strict=True,
                inject_missing_state=True,  # the Trainer's DeepSpeed checkpoints lack the version entry
            )
        )
    manifest = read_manifest(checkpoint)
    write_manifest(
        staged, manifest["step"], manifest["run_name"], manifest.get("run"), manifest.get("model_only", False)
    )
    if target.exists():
        shutil.rmtree(target)
    os.replace(staged, target)
    if not any(staged.parent.iterdir()):
        staged.parent.rmdir()
    return target


def load_universal_checkpoint(training_args: TrainingArguments) -> None:
    """Make the DeepSpeed engine the Trainer builds read universal checkpoints.

    The Trainer gives the plugin's config dict, filled with the training arguments, to DeepSpeed.
    """
    config: dict[str, Any] = training_args.deepspeed_plugin.deepspeed_config
    config.setdefault("checkpoint", {})["load_universal"] = True


def continue_on_this_world_size(
    checkpoint: Path | None, training_args: TrainingArguments, launch: Launch
) -> Path | None:
    """The checkpoint folder to load, with the training arguments set to continue the saved run here.

    Does nothing unless `--allow_world_size_change` is given. The accumulation is set even when the
    number of processes is the saved one: a requeue of a resumed run may pass the original command's.
    Collective under DeepSpeed: the main process converts while the others wait.
    """
    if checkpoint is None or not getattr(training_args, "allow_world_size_change", False):
        return checkpoint
    saved = checkpoint_geometry(checkpoint, training_args.gradient_accumulation_steps)
    now = saved.continued_on(launch.data_parallel_size, training_args.per_device_train_batch_size)
    is_main = training_args.process_index == 0
    if now.accumulation != training_args.gradient_accumulation_steps and is_main:
        logger.warning(f"finetune: resuming {checkpoint.name} ({saved.describe()}) with {now.describe()}")
    now.apply(training_args)
    if saved.data_parallel == now.data_parallel:
        return checkpoint
    tag = deepspeed_tag(checkpoint)
    if tag is None:
        return checkpoint
    if training_args.deepspeed_plugin is None:
        raise FinetuneError(
            f"{checkpoint} is a DeepSpeed checkpoint: resume it with a DeepSpeed (zero*) profile"
        )
    with training_args.main_process_first(local=False, desc="universal checkpoint conversion"):
        converted = convert_to_universal(checkpoint, tag) if is_main else universal_dir(checkpoint)
    if is_main:
        logger.warning(
            f"finetune: converted {checkpoint.name}'s ZeRO state to a universal checkpoint in {converted} "
            f"({checkpoint.name} is unchanged; the copy is not rotated: delete it when done)"
        )
    load_universal_checkpoint(training_args)
    return converted


def innermost_optimizer(optimizer: Any) -> Any:
    """The torch optimizer under accelerate's and DeepSpeed's wrappers (each keeps it as `.optimizer`)."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def place_step_counters(optimizer: Any) -> None:
    """Put each Adam `step` counter where torch would have created it: beside its parameter for the
    fused and capturable implementations, on the CPU otherwise.

    DeepSpeed's ZeRO-3 universal-checkpoint loader reads the optimizer state without a map_location,
    so on GPUs the counters arrive on the CPU and torch's fused AdamW stops at the first step.
    """
    optimizer = innermost_optimizer(optimizer)
    if not getattr(optimizer, "param_groups", None):
        return
    group = optimizer.param_groups[0]
    beside_the_parameter = bool(group.get("fused") or group.get("capturable"))
    for parameter, state in optimizer.state.items():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            device = parameter.device if beside_the_parameter else torch.device("cpu")
            if step.device != device:
                state["step"] = step.to(device)


class StepCountersOnTheirDevice(TrainerCallback):
    """Runs `place_step_counters` once the Trainer has loaded a checkpoint (before the first step)."""

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        if optimizer is not None:
            place_step_counters(optimizer)
