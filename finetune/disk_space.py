"""Disk space for checkpoints: checked before each save, freed and reported in one line when a save
runs out of it, and warned about at the start when the checkpoints the run keeps cannot all fit.

A save that fills the disk otherwise ends in chained tracebacks, leaves a partial staging folder that
keeps the space taken, and a `--resume` then fails for lack of the same space.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import torch

from finetune.checkpoint import checkpoints_newest_first, read_manifest, remove_if_empty
from finetune.errors import FinetuneError

ADAM_STATE_BYTES = 8  # exp_avg and exp_avg_sq, fp32, per trainable parameter
# A full fine-tuning checkpoint per parameter before the model exists (doctor): bf16 weights, the fp32
# master copy and Adam's states
CHECKPOINT_BYTES_PER_PARAMETER = 2 + 4 + ADAM_STATE_BYTES


def existing_folder(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists: a run that saves nothing until it is
    stopped has not made its output folder yet, and its disk is that folder's."""
    return next(p for p in (path.resolve(), *path.resolve().parents) if p.exists())


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(existing_folder(path)).free


def gib(size: float) -> str:
    return f"{size / 2**30:.2f} GiB"


def full_numel(parameter: torch.Tensor) -> int:
    """All of a parameter, sharded or not: DeepSpeed ZeRO-3 keeps its size in `ds_numel`; an FSDP2
    DTensor's numel is already the whole parameter's."""
    return getattr(parameter, "ds_numel", parameter.numel())


def expected_checkpoint_bytes(output_dir: Path, model: torch.nn.Module) -> int:
    """The newest checkpoint's size, as its manifest records it; before the first, the weights plus
    Adam's two fp32 states for the trainable ones."""
    for checkpoint in checkpoints_newest_first(output_dir):
        try:
            files = read_manifest(checkpoint)["files"]
        except (OSError, ValueError, KeyError):
            continue
        return sum(record if isinstance(record, int) else record["size"] for record in files.values())
    weights = sum(full_numel(p) * p.element_size() for p in model.parameters())
    return weights + sum(full_numel(p) * ADAM_STATE_BYTES for p in model.parameters() if p.requires_grad)


def room_problem(output_dir: Path, model: torch.nn.Module, step: int) -> str | None:
    """Why checkpoint-`step` will not fit beside what output_dir holds, or None."""
    expected, free = expected_checkpoint_bytes(output_dir, model), free_bytes(output_dir)
    if free >= expected:
        return None
    return (
        f"not enough disk space for checkpoint-{step} in {output_dir}: {gib(free)} free, about "
        f"{gib(expected)} needed; {last_complete(output_dir)}; free space (or lower --save_total_limit), "
        "then run again with --resume"
    )


def checkpoints_at_once(save_total_limit: int | None) -> int:
    """How many checkpoints are on disk at once: the kept ones and the one being written before the
    oldest is rotated out; at least the one being written when every checkpoint is kept."""
    return save_total_limit + 1 if save_total_limit else 1


def kept_checkpoints_problem(
    output_dir: Path, model: torch.nn.Module, save_total_limit: int | None
) -> str | None:
    """Why the checkpoints on disk at once (`checkpoints_at_once`) may not fit, or None."""
    keep = checkpoints_at_once(save_total_limit)
    expected, free = expected_checkpoint_bytes(output_dir, model), free_bytes(output_dir)
    if free >= keep * expected:
        return None
    return (
        f"{output_dir} has {gib(free)} free, {keep} checkpoints of about {gib(expected)} each will not fit: "
        "a save will stop the run (lower --save_total_limit or free space)"
    )


def last_complete(output_dir: Path) -> str:
    newest = checkpoints_newest_first(output_dir)
    return f"the last complete checkpoint is {newest[0].name}" if newest else "no checkpoint was completed"


# How torch.save's C++ writer reports a failed write (it raises RuntimeError, not OSError with ENOSPC)
STREAM_WRITE_FAILURES = (
    "iostream error",
    "unexpected pos",
    "PytorchStreamWriter failed",
    "file write failed",
)
NEARLY_FULL_BYTES = 1 << 20


def is_disk_full(error: BaseException, folder: Path | None = None) -> bool:
    """An OSError of a full disk or quota, also one chained under another error; or torch.save's
    RuntimeError of a failed write where the folder's disk is (nearly) full."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    # safetensors' and tokenizers' Rust writers raise their own exceptions carrying the OS error number
    if any(f"(os error {number})" in str(error) for number in (errno.ENOSPC, errno.EDQUOT)):
        return True
    if isinstance(error, RuntimeError) and any(marker in str(error) for marker in STREAM_WRITE_FAILURES):
        try:
            return folder is not None and free_bytes(folder) < NEARLY_FULL_BYTES
        except OSError:
            return False
    return False


def report_disk_full(
    error: BaseException, staged: Path, output_dir: Path, what: str | None = None
) -> FinetuneError:
    """Remove the partial copy (it holds the space a resume needs) and say what is left."""
    shutil.rmtree(staged, ignore_errors=True)
    remove_if_empty(staged.parent)
    return FinetuneError(
        f"disk full while writing {what or staged.name} into {output_dir} "
        f"({getattr(error, 'strerror', None) or 'no space left on device'}): the partial copy is "
        f"removed; {last_complete(output_dir)}; free space, then run again with --resume"
    )
