"""`finetune export`: a checkpoint of any profile as a plain model folder, never over a run's results."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from finetune.errors import FinetuneError


@dataclass
class ExportFlags:
    checkpoint: str = field(
        metadata={"positional": True, "help": "a checkpoint-N folder (DDP, FSDP or DeepSpeed ZeRO)"}
    )
    output_dir: str = field(
        metadata={"positional": True, "help": "folder for config.json, tokenizer and model.safetensors"}
    )
    dtype: Literal["fp32", "bf16", "fp16"] = field(default="fp32", metadata={"help": "weights dtype"})
    overwrite: bool = field(default=False, metadata={"help": "export into a folder that already holds files"})
    merge: bool = field(
        default=False,
        metadata={
            "help": "a --peft run's checkpoint: merge the adapters into the base model and write a plain "
            "model (default: the adapter folder, for PeftModel.from_pretrained)"
        },
    )
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "a --peft run's checkpoint: the base model to put its adapters on (default: the one "
            "its run recorded, an absolute path or a name)"
        },
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "export",
        help="write a checkpoint of any profile as a plain Hugging Face model folder",
        dataclass_types=[ExportFlags],
    )


def check_export_source(checkpoint: Path) -> None:
    """A run's output_dir or a model folder given for a checkpoint: say what to pass, or that the folder
    is already what export writes (where the checkpoint's own check would call it half-written)."""
    from finetune.checkpoint import checkpoints_newest_first, folder_step
    from finetune.models import has_weights
    from finetune.run_folder import MANIFEST

    if not checkpoint.is_dir() or (checkpoint / MANIFEST).exists():
        return
    newest = checkpoints_newest_first(checkpoint)
    if newest:
        raise FinetuneError(
            f"{checkpoint} is a run's output_dir, not a checkpoint: pass one of its checkpoints, the newest "
            f"being {newest[0]} (its final model is already a model folder: eval and generate take it)"
        )
    if folder_step(checkpoint) is None and has_weights(checkpoint):
        raise FinetuneError(
            f"{checkpoint} is a model folder, not a checkpoint: it already is what export writes (eval and "
            "generate take it as it is)"
        )


def check_export_folder(checkpoint: Path, folder: Path, overwrite: bool) -> None:
    """An export never replaces a run's results (a finished run's, or a live one's), and replaces other
    files only when asked to."""
    from finetune.outputs import read_holder
    from finetune.run_folder import CHECKPOINT_PREFIX, LOCK_FILE, SUMMARY_FILE

    run_dir = checkpoint.resolve().parent
    target = folder.resolve()
    if target == run_dir:
        raise FinetuneError(
            f"{folder} is the output_dir of the run that saved {checkpoint}: exporting there would replace "
            "its final model; choose another folder"
        )
    if target == checkpoint.resolve() or checkpoint.resolve() in target.parents:
        raise FinetuneError(f"{folder} is inside the checkpoint {checkpoint}: choose another folder")
    if folder.exists() and not folder.is_dir():
        raise FinetuneError(f"{folder} is a file, not a folder: choose a folder to export into")
    holder = read_holder(folder / LOCK_FILE)
    if holder is not None and not holder.is_gone():
        raise FinetuneError(
            f"{folder} is the output_dir of a running run (pid {holder.pid}): choose another folder"
        )
    if (folder / SUMMARY_FILE).exists() or any(folder.glob(f"{CHECKPOINT_PREFIX}*")):
        raise FinetuneError(
            f"{folder} holds a run's results ({SUMMARY_FILE}, checkpoints): --overwrite replaces an earlier "
            "export, never a run; choose another folder"
        )
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise FinetuneError(f"{folder} is not empty: pass --overwrite to replace what is in it")


def execute(options: argparse.Namespace) -> int:
    from finetune.checkpoint import load_weights_only
    from finetune.export import export_checkpoint

    check_export_source(Path(options.checkpoint))
    check_export_folder(Path(options.checkpoint), Path(options.output_dir), options.overwrite)
    load_weights_only()
    folder = export_checkpoint(
        options.checkpoint, options.output_dir, options.dtype, options.merge, options.base_model
    )
    print(f"finetune: exported {options.checkpoint} to {folder} ({options.dtype})")
    return 0
