"""`finetune plan`: the planner's tables (finetune/planner.py) for a model, a GPU count and a batch."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from finetune.commands.shared import (
    Fraction,
    PicturePath,
    PositiveFloat,
    PositiveInt,
    names,
    parse_run_flags,
    shipped_for_help,
)
from finetune.errors import FinetuneError
from finetune.layout import ParallelLayout

if TYPE_CHECKING:
    from finetune.workload import ModelShape, Workload


@dataclass
class PlanFlags:
    gpus: PositiveInt = field(default=1, metadata={"help": "GPUs in all"})
    gpus_per_node: PositiveInt | None = field(
        default=None, metadata={"help": "GPUs per machine, for host RAM (default: --gpus)"}
    )
    gpu_memory: PositiveFloat | None = field(
        default=None, metadata={"help": "GiB per GPU (default: the visible GPU's)"}
    )
    profiles: str | None = field(
        default=None,
        metadata={
            "help": "comma-separated profile names or YAML files (default: every profile that runs on "
            "--gpus, fastest first)"
        },
    )
    largest: bool = field(
        default=False,
        metadata={
            "help": "instead: the largest GPT-style model each profile is predicted to fit (--model is "
            "ignored)"
        },
    )
    longest_block: bool = field(
        default=False,
        metadata={
            "help": "instead: the longest block of --model each profile is predicted to fit at --batch_size "
            "(with --sequence_parallel N, split over N GPUs), up to the model's context"
        },
    )
    host_memory: PositiveFloat | None = field(
        default=None, metadata={"help": "GiB of host RAM per node, for --largest"}
    )
    margin: Fraction | None = field(
        default=None,
        metadata={"help": "share of GPU memory kept free (default: the planner's error, 0.15)"},
    )
    picture: PicturePath | None = field(
        default=None,
        metadata={
            "help": "also draw each profile's predicted memory, stacked by parameters, gradients, "
            "optimizer and activations, beside the GPU's memory, into this file (.png, .svg or .pdf)"
        },
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    shipped = shipped_for_help()
    commands.add_parser(
        "plan",
        help="predict memory per GPU for every profile, and recommend one",
        description="The run is described by run flags, read as `finetune run` reads them (a recipe first, "
        "if any): --model, --config_overrides, --batch_size, --block_size, --precision, "
        "--gradient_checkpointing, --torch_compile (default: as run.py does: "
        f"{names([s for s in shipped if s.compiled_by_default])} compiled, the rest eager), --peft, "
        "--global_batch_size (also show the micro batch and accumulation a run would choose under each "
        "profile). `--precision auto` plans bf16, or fp16 where the visible GPU has no bf16. Profiles, "
        f"fastest first: {names(shipped)}.",
        dataclass_types=[PlanFlags],
    )


class PlannedRun(NamedTuple):
    """What the run flags describe, read once: the model's shape, the Workload, the global batch,
    the sequence degree and the model flags."""

    shape: ModelShape
    workload: Workload
    global_batch: int | None
    sequence_parallel: int
    model_args: Any

    def context(self) -> tuple[int, str] | None:
        """The model's context (its overrides applied) and the config key that sets it; None if it
        names none."""
        from finetune.model_shapes import model_config
        from finetune.models import context_key

        config = model_config(self.model_args.model, self.model_args.config_overrides)
        key = context_key(config)
        return (getattr(config, key), key) if key else None


def planned_run(run_args: list[str], largest: bool) -> PlannedRun:
    """The run the flags describe, made by the planner's one reading of run flags
    (`planner.run_workload`), as `--global_batch_size` and `--profile auto` make them; `--precision
    auto` planned for the visible GPU, else one with bf16."""
    from finetune.launched import precision_on, visible_gpu_supports_bf16
    from finetune.model_shapes import LADDER_BLOCK_SIZE
    from finetune.planner import run_workload

    model_args, data_args, training_args = parse_run_flags(run_args)
    if largest and data_args.block_size is None:  # the ladder's shapes, at their context
        data_args.block_size = LADDER_BLOCK_SIZE
    bf16 = visible_gpu_supports_bf16()
    bf16 = True if bf16 is None else bf16  # planned here for a GPU elsewhere: one with bf16
    shape, workload = run_workload(model_args, data_args, training_args, precision_on(training_args, bf16))
    global_batch, degree = training_args.global_batch_size, training_args.sequence_parallel
    return PlannedRun(shape, workload, global_batch, degree, model_args)


def execute(options: argparse.Namespace, run_args: list[str]) -> int:
    from finetune.calibration import measured_calibration
    from finetune.limits import format_largest, format_longest_block
    from finetune.memory_model import DEFAULT_MARGIN
    from finetune.planner import (
        Hardware,
        format_global_batch,
        format_plan,
        largest_micro_batch,
        plan,
        recommend,
        visible_gpu_memory_gib,
        what_would_fit,
    )

    memory = options.gpu_memory or visible_gpu_memory_gib()
    if memory is None:
        raise FinetuneError("no GPU is visible: pass --gpu_memory GIB")
    calibration = measured_calibration()
    if options.margin is None:
        options.margin = DEFAULT_MARGIN
    if options.largest and options.longest_block:
        raise FinetuneError("--largest and --longest_block ask two questions: ask one")
    run = planned_run(run_args, options.largest)
    shape, workload, global_batch = run.shape, run.workload, run.global_batch
    layout = ParallelLayout(options.gpus, run.sequence_parallel)
    profiles = options.profiles.split(",") if options.profiles else None
    if options.longest_block:
        hardware = Hardware(layout, memory, options.host_memory, options.gpus_per_node, options.margin)
        print(format_longest_block(shape, workload, hardware, calibration, run.context(), profiles))
        return 0
    if options.largest:
        hardware = Hardware(layout, memory, options.host_memory, options.gpus_per_node, options.margin)
        print(format_largest(workload, hardware, calibration, profiles))
        return 0
    hardware = Hardware(layout, memory, gpus_per_node=options.gpus_per_node, margin=options.margin)
    estimates = plan(shape, workload, layout, calibration, profiles)
    strategies = [e.strategy for e in estimates]
    # made before anything is printed: a global batch the processes cannot share is refused alone
    by_global_batch = (
        format_global_batch(shape, workload, strategies, hardware, calibration, global_batch)
        if global_batch is not None
        else None
    )
    print(format_plan(shape, workload, estimates, hardware))
    if options.picture is not None:
        from finetune.pictures import plan_picture

        title = (
            f"{shape.name}, micro batch {workload.micro_batch} x {workload.block_size}, {options.gpus} GPU(s)"
        )
        plan_picture(estimates, memory, options.margin, title, options.picture)
        print(f"picture: {options.picture}")
    best = recommend(estimates, memory, options.margin)
    if best is not None:
        largest = largest_micro_batch(best.strategy, shape, workload, hardware, calibration)
        print(f"largest micro batch predicted to fit with {best.profile}: {largest}")
        order = ", ".join(e.profile for e in estimates)
        print(f"recommended: {best.profile} (the first that fits, in the order {order})")
    if by_global_batch is not None:  # last: with it, `--profile auto` weighs this, not the micro batch above
        print()
        print(by_global_batch)
    if best is not None:
        return 0
    print("nothing fits; changes that would:")
    for change in what_would_fit(shape, workload, layout, memory, calibration, options.margin):
        print(f"  {change}")
    return 1
