"""`finetune plan`: the planner's tables (finetune/planner.py) for a model, a GPU count and a batch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.commands.shared import (
    PLAN_ADAPTER_FLAGS,
    fraction,
    names,
    positive_float,
    positive_int,
    shipped_for_help,
)
from finetune.errors import FinetuneError
from finetune.layout import ParallelLayout
from finetune.run_flags import ModelArguments, add_run_flags

if TYPE_CHECKING:
    from finetune.memory_model import Workload


def add_parser(commands: argparse._SubParsersAction) -> None:
    shipped = shipped_for_help()
    planning = commands.add_parser("plan", help="predict memory per GPU for every profile, and recommend one")
    planning.add_argument("--model", default="gpt2", help="name, GPT-2 alias or local folder (config only)")
    planning.add_argument("--config_overrides", help='change the shape: "n_layer=32,n_embd=4096,n_head=32"')
    planning.add_argument("--gpus", type=positive_int, default=1, help="GPUs in all")
    planning.add_argument(
        "--gpus_per_node", type=positive_int, help="GPUs per machine, for host RAM (default: --gpus)"
    )
    planning.add_argument(
        "--gpu_memory", type=positive_float, help="GiB per GPU (default: the visible GPU's)"
    )
    planning.add_argument("--batch_size", type=positive_int, default=8, help="micro batch per GPU")
    planning.add_argument(
        "--block_size", type=positive_int, help="tokens per sample (default: context, at most 1024)"
    )
    planning.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    planning.add_argument("--gradient_checkpointing", action="store_true")
    add_run_flags(planning, ModelArguments, PLAN_ADAPTER_FLAGS)  # planned as run.py trains them
    planning.add_argument(
        "--torch_compile",
        choices=["true", "false"],
        help="plan compiled or eager runs (default: as run.py does: "
        f"{names([s for s in shipped if s.compiled_by_default])} compiled, the rest eager)",
    )
    planning.add_argument(
        "--profiles",
        help="comma-separated profile names or YAML files (default: every profile that runs on --gpus, "
        f"fastest first: {names(shipped)})",
    )
    planning.add_argument(
        "--largest",
        action="store_true",
        help="instead: the largest GPT-style model each profile is predicted to fit (--model is ignored)",
    )
    planning.add_argument(
        "--host_memory", type=positive_float, help="GiB of host RAM per node, for --largest"
    )
    planning.add_argument(
        "--margin", type=fraction, help="share of GPU memory kept free (default: the planner's error, 0.15)"
    )
    planning.add_argument(
        "--picture",
        type=Path,
        help="also draw each profile's predicted memory, stacked by parameters, gradients, optimizer "
        "and activations, beside the GPU's memory, into this PNG",
    )
    planning.add_argument(
        "--global_batch_size",
        type=positive_int,
        help="also show the micro batch and accumulation `finetune run --global_batch_size` would choose "
        "under each profile",
    )


def workload_of(options: argparse.Namespace, block_size: int) -> Workload:
    from finetune.memory_model import Workload

    compiled = {"true": True, "false": False}.get(options.torch_compile)
    # the adapter flags checked as run.py checks them
    adapters = ModelArguments(**{name: getattr(options, name) for name in PLAN_ADAPTER_FLAGS})
    return Workload(
        micro_batch=options.batch_size,
        block_size=block_size,
        dtype=options.precision,
        gradient_checkpointing=options.gradient_checkpointing,
        compiled=compiled,
        peft=adapters.peft,
        lora_rank=adapters.lora_rank,
        lora_dropout=adapters.lora_dropout,
    )


def execute(options: argparse.Namespace) -> int:
    from finetune.memory_model import DEFAULT_MARGIN, Calibration
    from finetune.planner import (
        LADDER_BLOCK_SIZE,
        Hardware,
        format_global_batch,
        format_largest,
        format_plan,
        largest_micro_batch,
        plan,
        recommend,
        shape_of,
        visible_gpu_memory_gib,
        what_would_fit,
    )

    memory = options.gpu_memory or visible_gpu_memory_gib()
    if memory is None:
        raise FinetuneError("no GPU is visible: pass --gpu_memory GIB")
    calibration = Calibration.measured()
    if options.margin is None:
        options.margin = DEFAULT_MARGIN
    layout = ParallelLayout(options.gpus)
    if options.largest:
        workload = workload_of(options, options.block_size or LADDER_BLOCK_SIZE)
        hardware = Hardware(layout, memory, options.host_memory, options.gpus_per_node, options.margin)
        print(format_largest(workload, hardware, calibration))
        return 0
    hardware = Hardware(layout, memory, gpus_per_node=options.gpus_per_node, margin=options.margin)
    shape, block_size = shape_of(options.model, options.config_overrides, options.block_size)
    workload = workload_of(options, block_size)
    profiles = options.profiles.split(",") if options.profiles else None
    estimates = plan(shape, workload, layout, calibration, profiles)
    print(format_plan(shape, workload, estimates, hardware))
    if options.picture is not None:
        from finetune.pictures import plan_picture

        title = (
            f"{shape.name}, micro batch {workload.micro_batch} x {workload.block_size}, {options.gpus} GPU(s)"
        )
        plan_picture(estimates, memory, options.margin, title, options.picture)
        print(f"picture: {options.picture}")
    if options.global_batch_size is not None:
        print()
        print(
            format_global_batch(shape, workload, estimates, hardware, calibration, options.global_batch_size)
        )
    best = recommend(estimates, memory, options.margin)
    if best is not None:
        largest = largest_micro_batch(best.strategy, shape, workload, hardware, calibration)
        print(f"largest micro batch predicted to fit with {best.profile}: {largest}")
        order = ", ".join(e.profile for e in estimates)
        print(f"recommended: {best.profile} (the first that fits, in the order {order})")
        return 0
    print("nothing fits; changes that would:")
    for change in what_would_fit(shape, workload, layout, memory, calibration, options.margin):
        print(f"  {change}")
    return 1
