"""Resume means the same run: a checkpoint records what run wrote it, and `--resume` refuses another.

Every checkpoint's manifest holds the run's identity under "run": how it was distributed (strategy,
processes, batch geometry) and the flags that define what it computes. A resume with a different
identity would not continue that run: the Trainer loads what it can (a ZeRO-2 checkpoint under DDP
loads the weights, starts a fresh optimizer and restarts the LR schedule) and reports success. So
the differences are one `finetune: error:` line, found before data and model are built.

`run_differences` is public for `--allow_world_size_change`, which tolerates exactly the
differences in WORLD_SIZE_CHANGE_FIELDS and converts the checkpoint (finetune/reshard.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.optim.lr_scheduler import LambdaLR
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.utils import logging

from finetune.checkpoint import checkpoints_newest_first, holds_model_only, read_manifest, swapped_to_nvme
from finetune.errors import Diverged, FinetuneError
from finetune.launched import BatchGeometry, Launch, mixed_precision
from finetune.summary import read_summary

logger = logging.get_logger("finetune")

GEOMETRY_FIELDS = (
    "strategy",
    "world_size",
    "sequence_parallel_size",  # at one world size it changes the data-parallel ranks, so the global batch
    "micro_batch_size",
    "gradient_accumulation_steps",
)
WORLD_SIZE_CHANGE_FIELDS = ("world_size", "gradient_accumulation_steps")

# What a run computes: the model it starts from, the samples it sees in what order, the objective and
# the optimizer's schedule. A different value makes the continuation another run (the LR schedule
# depends on the length, the data order on the seeds and the blocks on the tokenizer and block size).
# Flags that change only speed or memory (compilation, gradient checkpointing, chunked loss, logging,
# saving, evaluation) are left out: resuming with them changed yields the same run.
MODEL_FLAGS = ("model", "config_overrides", "from_scratch", "tokenizer")
DATA_FLAGS = (
    "dataset",
    "dataset_config",
    "text_column",
    "block_size",
    "packing",
    "data_format",
    "train_on_prompt",
    "chat_template",
    "validation_split_percentage",
    "max_train_samples",
)
TRAINING_FLAGS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "optim",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "max_steps",
    "num_train_epochs",
    "seed",
    "data_seed",
)


@dataclass(frozen=True)
class Difference:
    field: str
    recorded: Any
    current: Any


def _plain(value: Any) -> Any:
    """Enums (scheduler, optimizer) as their names, so the identity is JSON and compares after a reload."""
    return getattr(value, "value", value)


def defining_flags(model_args: Any, data_args: Any, training_args: TrainingArguments) -> dict[str, Any]:
    flags = {name: _plain(getattr(model_args, name)) for name in MODEL_FLAGS}
    flags.update({name: _plain(getattr(data_args, name)) for name in DATA_FLAGS})
    flags.update({name: _plain(getattr(training_args, name)) for name in TRAINING_FLAGS})
    flags["precision"] = mixed_precision(training_args)
    return flags


def run_identity(
    flags: dict[str, Any], launch: Launch, training_args: TrainingArguments, data_source: str | None = None
) -> dict[str, Any]:
    """The manifest's "run" entry: the launch's strategy and processes, the batch geometry, the flags.

    `data_source`, where the data was read from, is not compared on resume (the same files may move);
    evaluation of the checkpoint or its export recognises the run's data by it (finetune/evaluation.py).
    """
    geometry = BatchGeometry.of(training_args, launch.data_parallel_size)
    fields = launch.strategy_fields()
    return {
        "profile": launch.profile,
        "strategy": fields["strategy"],
        "distributed_type": fields["distributed_type"],
        "zero_stage": fields["zero_stage"],
        **launch.layout.summary_fields(),
        "micro_batch_size": geometry.micro,
        "gradient_accumulation_steps": geometry.accumulation,
        "global_batch_size": geometry.global_batch,
        "flags": flags,
        "data_source": data_source,
    }


# Strategy names that checkpoints written before the profile names were used throughout recorded
LEGACY_STRATEGY_NAMES = {"fsdp2": "fsdp", "fsdp2_grad_op": "fsdp_grad_op"} | {
    f"zero{stage}+offload_{device}": f"zero{stage}_{'nvme' if device == 'nvme' else 'offload'}"
    for stage in (1, 2, 3)
    for device in ("cpu", "nvme")
}


def _comparable(field: str, value: Any) -> Any:
    """DDP on one process is named single: a change of process count, not of strategy. Checkpoints
    written before sequence parallelism recorded no degree: theirs is 1."""
    if field == "sequence_parallel_size":
        return 1 if value is None else value
    if field != "strategy":
        return value
    value = LEGACY_STRATEGY_NAMES.get(value, value)
    return "ddp" if value == "single" else value


def run_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[Difference]:
    """Where this run's identity differs from a checkpoint's: geometry first, then flags."""
    differences = [
        Difference(name, recorded.get(name), current.get(name))
        for name in GEOMETRY_FIELDS
        if _comparable(name, recorded.get(name)) != _comparable(name, current.get(name))
    ]
    recorded_flags = recorded.get("flags", {})
    differences += [
        Difference(name, recorded_flags.get(name), value)
        for name, value in current["flags"].items()
        if recorded_flags.get(name) != value
    ]
    return differences


def _geometry(identity: dict[str, Any]) -> str:
    processes = identity["world_size"]
    degree = identity.get("sequence_parallel_size") or 1
    split = f" (sequence parallel {degree})" if degree > 1 else ""
    return (
        f"{identity['strategy']} with {processes} process{'es' if processes != 1 else ''}{split}, micro "
        f"batch {identity['micro_batch_size']} x {identity['gradient_accumulation_steps']}"
    )


def _flag(name: str, value: Any) -> str:
    shown = "unset" if value is None else value if isinstance(value, str) else json.dumps(value)
    return f"--{name} {shown}"


def describe_differences(
    checkpoint: Path, recorded: dict[str, Any], current: dict[str, Any], differences: list[Difference]
) -> str:
    """One sentence: what wrote the checkpoint, what this run is, and how to go on."""
    fields = {difference.field for difference in differences}
    flags = [difference for difference in differences if difference.field not in GEOMETRY_FIELDS]
    then = [_flag(d.field, d.recorded) for d in flags]
    now = [_flag(d.field, d.current) for d in flags]
    if fields & set(GEOMETRY_FIELDS):
        then = [f"by {_geometry(recorded)}", *then]
        now = [f"is {_geometry(current)}", *now]
    else:
        then = [f"with {then[0]}", *then[1:]]
        now = [f"has {now[0]}", *now[1:]]
    advice = "resume with the same profile, processes and flags, or start a new run in another --output_dir"
    if fields <= set(WORLD_SIZE_CHANGE_FIELDS):
        advice += " (or pass --allow_world_size_change to continue on a different number of processes)"
    return f"{checkpoint.name} was written {', '.join(then)}; this run {', '.join(now)}: {advice}"


def refuse_another_run(
    checkpoint: Path,
    current: dict[str, Any],
    allow_world_size_change: bool,
    is_main_process: bool,
    global_batch_size: int | None = None,
) -> None:
    """Raise FinetuneError unless `current` continues the run that wrote `checkpoint`.

    A checkpoint written before identities were recorded resumes with a warning: nothing to compare.
    A `--global_batch_size` must be the checkpoint's global batch, however either was made up: under
    `--allow_world_size_change` the accumulation is otherwise free, and finetune/reshard.py would
    quietly keep the checkpoint's global batch instead of the one asked for.
    """
    recorded = read_manifest(checkpoint).get("run")
    if recorded is None:
        if is_main_process:
            logger.warning(
                f"finetune: {checkpoint} does not record the run that wrote it (an older finetune): "
                "resuming without checking that profile, processes and flags match"
            )
        return
    written = recorded.get("global_batch_size")
    if global_batch_size is not None and written is not None and written != global_batch_size:
        raise FinetuneError(
            f"{checkpoint.name} was written with global batch {written}; this run asks for "
            f"--global_batch_size {global_batch_size}: resume with --global_batch_size {written}, or start "
            "a new run in another --output_dir"
        )
    differences = run_differences(recorded, current)
    if extends_max_steps(recorded, current):  # training a run further, as the Trainer allows
        differences = [d for d in differences if d.field != "max_steps"]
    if allow_world_size_change:
        differences = [d for d in differences if d.field not in WORLD_SIZE_CHANGE_FIELDS]
    if differences:
        raise FinetuneError(describe_differences(checkpoint, recorded, current, differences))


def extends_max_steps(recorded: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether this run asks for more steps than the checkpoint's run did, and is otherwise that run."""
    then, now = recorded.get("flags", {}).get("max_steps"), current["flags"].get("max_steps")
    return isinstance(then, int) and then > 0 and isinstance(now, int) and now > then


def extended_from(checkpoint: Path | None, training_args: TrainingArguments) -> tuple[int, int] | None:
    """(the checkpoint's --max_steps, its step) when this run continues it to a larger --max_steps."""
    if checkpoint is None:
        return None
    manifest = read_manifest(checkpoint)
    then = manifest.get("run", {}).get("flags", {}).get("max_steps")
    if isinstance(then, int) and 0 < then < training_args.max_steps:
        return then, manifest["step"]
    return None


class ContinueTheReplannedSchedule(TrainerCallback):
    """Resumed to a larger --max_steps, the Trainer plans the schedule for the new end and continues it
    from the checkpoint's step, but the optimizer's learning rates come from the checkpoint, where the
    old schedule had (nearly) ended: the first step would train at that rate. Once both are loaded
    (the loop starts after), the rates are set to the new schedule's at the checkpoint's step."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        scheduler, optimizer = kwargs.get("lr_scheduler"), kwargs.get("optimizer")
        if not isinstance(scheduler, LambdaLR) or optimizer is None:
            return
        rates = [
            base * factor(scheduler.last_epoch)
            for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
        ]
        for group, rate in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        scheduler._last_lr = rates  # what get_last_lr() reports, and the Trainer logs


def finished_run(output_dir: str, checkpoint: Path | None, resume: bool) -> str | None:
    """Why resuming would do nothing: the run completed. FinetuneError for a run whose last step was
    saved but that did not complete (it failed or was stopped while evaluating or saving the model).

    Without this the Trainer, resumed at max_steps, takes one step past it and records that step's
    loss as the run's train_loss. A last-step checkpoint of an incomplete run is not "nothing to do":
    its final model was never saved, so the user is told how to get it instead of a silent exit 0.
    """
    status = run_status(output_dir) if resume or checkpoint is not None else None
    state_file = checkpoint / TRAINER_STATE_NAME if checkpoint is not None else None
    if state_file is not None and state_file.is_file():
        state = TrainerState.load_from_json(str(state_file))
        if state.max_steps and state.global_step >= state.max_steps:
            last = f"{checkpoint} is the last step of its run ({state.global_step} of {state.max_steps})"
            if status == "completed":
                return last
            raise FinetuneError(
                f"{last} but the run did not complete (run_summary.json: {status or 'none'}): "
                f"`finetune export {checkpoint} DIR` writes its model and `finetune eval DIR` evaluates it"
            )
    if resume and status == "completed":
        return f"the run in {output_dir} has completed (run_summary.json)"
    return None


def run_status(output_dir: str) -> str | None:
    try:
        return read_summary(output_dir).get("status")
    except (OSError, ValueError):
        return None


def check_resume(
    checkpoint: Path | None, flags: dict[str, Any], training_args: Any, launch: Launch
) -> str | None:
    """Before data and model: refuse a resume of another run; say why there is nothing to resume.

    Returns the reason a finished run has nothing left to do, else None (train).
    """
    if checkpoint is not None:
        current = run_identity(flags, launch, training_args)
        refuse_another_run(
            checkpoint,
            current,
            training_args.allow_world_size_change,
            training_args.process_index == 0,
            training_args.global_batch_size,
        )
    extending = extended_from(checkpoint, training_args) is not None  # a finished run trains further
    finished = None if extending else finished_run(training_args.output_dir, checkpoint, training_args.resume)
    if finished is None and checkpoint is not None and swapped_to_nvme(checkpoint):
        raise FinetuneError(
            f"{checkpoint} holds optimizer states swapped to NVMe (zero3_nvme), which DeepSpeed does not "
            "resume as the same run: its Adam state restarts and the first step's update is lost; "
            + how_to_continue(checkpoint)
        )
    if finished is None and checkpoint is not None and holds_model_only(checkpoint):
        raise FinetuneError(
            f"{checkpoint} holds the model only (--save_only_model): no optimizer, scheduler or data "
            f"position to continue the run from; {how_to_continue(checkpoint)}"
        )
    return finished


def how_to_continue(checkpoint: str | Path | None) -> str:
    """What to do with the checkpoint a stopped run leaves: resume it, or (zero3_nvme, --save_only_model)
    export it and start from its weights."""
    if checkpoint is not None and (swapped_to_nvme(Path(checkpoint)) or holds_model_only(Path(checkpoint))):
        return f"start a new run from its weights: finetune export {checkpoint} DIR, then --model DIR"
    return "run the same command with --resume to continue"


@contextlib.contextmanager
def how_to_go_on_after_divergence(output_dir: str | Path) -> Iterator[None]:
    """A diverged run's line ends with the way on: its newest checkpoint passed the loss and weight
    checks before it was saved, but `--resume` would continue the same run, learning rate included.
    Its weights start a new run, with a fresh optimizer, at another learning rate."""
    try:
        yield
    except Diverged as diverged:
        newest = checkpoints_newest_first(output_dir)
        if not newest:
            raise Diverged(
                f"{diverged}; no checkpoint was saved: start again with a lower --learning_rate"
            ) from None
        raise Diverged(
            f"{diverged}; {newest[0]} was checked before it was saved: to go on from it with another "
            f"learning rate, finetune export {newest[0]} DIR, then run with --model DIR and a lower "
            "--learning_rate"
        ) from None
