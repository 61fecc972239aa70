"""`finetune plan`: predicted memory per GPU for every profile, before anything is launched, on the
memory model of finetune/memory_model.py: which profile fits and is fastest, the largest micro batch
and model each fits, what would make a model fit, and the tables of them. The same model gives a run
launched with `--global_batch_size` its micro batch (`apply_global_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers.utils import logging

from finetune.adapters import ALL_LINEAR, check_rank
from finetune.calibration import estimate_for, measured_calibration, read_measurements
from finetune.callbacks import GIB
from finetune.errors import FinetuneError
from finetune.launched import BatchGeometry, Launch, asked_evaluation_micro_batch, mixed_precision
from finetune.layout import ParallelLayout
from finetune.memory_model import DEFAULT_MARGIN, MAX_MICRO_BATCH, Calibration, Estimate, estimate
from finetune.model_shapes import shape_of
from finetune.profiles import (
    Strategy,
    fastest_first,
    load_strategy,
    shipped_strategies,
)
from finetune.workload import FSDP_BLOCKS_PER_UNIT, ModelShape, Workload, trained_parameters

logger = logging.get_logger("finetune")


def planned_strategies(
    profiles: list[str] | None, layout: ParallelLayout, fp8: bool = False
) -> list[Strategy]:
    """What to plan, fastest first: the profiles given (names or YAML files, read as any command
    reads them), else every shipped profile that runs on the layout's processes (with a sequence
    group, the profiles that split sequences; with --fp8, those it runs under)."""
    one_process = layout.world_size == 1
    if not profiles:
        return [
            strategy
            for strategy in shipped_strategies()
            if (strategy.multi_process or one_process)
            and (strategy.splits_sequences or layout.sequence_parallel == 1)
            and (strategy.runs_float8 or not fp8)
        ]
    strategies = [load_strategy(name) for name in profiles]
    single = [strategy.name for strategy in strategies if not strategy.multi_process]
    if single and not one_process:
        raise FinetuneError(f"profile {', '.join(single)} runs one process: plan it with --gpus 1")
    without_float8 = [strategy.name for strategy in strategies if not strategy.runs_float8]
    if fp8 and without_float8:
        raise FinetuneError(
            f"--fp8 runs under single, ddp and the FSDP profiles, not {', '.join(without_float8)}"
        )
    return fastest_first(strategies)


# Parameters x tokens of a process's micro batch from which FSDP2 ran at least as fast as ddp and
# ZeRO-1/2 at the same micro batch: its per-step host work (the sharding floor) is then hidden under
# the compute. Measured on 2 and 4 GPUs (docs/speed.md): above it, gpt2-xl at 8 x 1024 and gpt2-medium
# at 32 x 1024; below it, gpt2-medium at 8 x 1024, where ddp and ZeRO-1/2 ran ahead of FSDP2.
FSDP_FIRST_PARAMETER_TOKENS = 1e13


def speed_rank(strategy: Strategy, shape: ModelShape, workload: Workload) -> tuple:
    """Sort key, fastest first, for this model at this micro batch: the profiles' speed order, with
    the FSDP profiles first where the micro batch's work hides their host work."""
    offload, moved, *rest = strategy.speed_order
    work = shape.parameters * workload.micro_batch * workload.block_size
    fsdp_first = strategy.framework == "fsdp" and work >= FSDP_FIRST_PARAMETER_TOKENS
    return (offload, moved, not fsdp_first, *rest)


def plan(
    shape: ModelShape,
    workload: Workload,
    layout: ParallelLayout,
    calibration: Calibration,
    profiles: list[str] | None = None,
) -> list[Estimate]:
    """Every planned profile's estimate, fastest first for this model and micro batch (`speed_rank`)."""
    planned = planned_strategies(profiles, layout, workload.fp8)
    strategies = sorted(planned, key=lambda s: speed_rank(s, shape, workload))
    return [estimate(strategy, shape, workload, layout, calibration) for strategy in strategies]


def recommend(
    estimates: list[Estimate], gpu_memory_gib: float, margin: float = DEFAULT_MARGIN
) -> Estimate | None:
    """The first (fastest) profile that fits with the margin: `plan` orders them fastest first."""
    fitting = [e for e in estimates if e.fits(gpu_memory_gib, margin)]
    return fitting[0] if fitting else None


@dataclass(frozen=True)
class Hardware:
    """What a model must fit in: every GPU's memory and, when known, each node's host RAM; `layout`
    is how the run's processes, one per GPU, divide the work."""

    layout: ParallelLayout
    gpu_memory_gib: float
    host_memory_gib: float | None = None
    gpus_per_node: int | None = None
    margin: float = DEFAULT_MARGIN

    @property
    def gpus(self) -> int:
        return self.layout.devices

    def host_per_node(self, e: Estimate) -> float:
        return e.host_per_gpu * min(self.gpus_per_node or self.gpus, self.gpus)

    def holds(self, e: Estimate) -> bool:
        host_fits = self.host_memory_gib is None or self.host_per_node(e) <= self.host_memory_gib * (
            1 - self.margin
        )
        return e.fits(self.gpu_memory_gib, self.margin) and host_fits


def largest_micro_batch(
    strategy: Strategy, shape: ModelShape, workload: Workload, hardware: Hardware, calibration: Calibration
) -> int:
    """The largest micro batch this profile is predicted to fit (0 if none): larger micro batches
    keep the GPU busier and ran faster (docs/speed.md)."""
    batch = 0
    while batch < MAX_MICRO_BATCH:
        bigger = replace(workload, micro_batch=batch + 1)
        if not hardware.holds(estimate(strategy, shape, bigger, hardware.layout, calibration)):
            break
        batch += 1
    return batch


def largest_micro_batch_for_share(
    strategy: Strategy,
    shape: ModelShape,
    workload: Workload,
    hardware: Hardware,
    calibration: Calibration,
    per_process: int,
) -> int:
    """The largest micro batch that divides a process's share of the global batch and is predicted
    to fit with the accumulation that makes up the rest (0 if none). Accumulating is not free under
    torch's DDP and FSDP2, which hold a step's gradients whole until its last micro batch
    (`accumulated_gradient_gib`): a micro batch that fits alone may not fit a step of several."""
    for micro in sorted((d for d in range(1, min(per_process, MAX_MICRO_BATCH) + 1) if per_process % d == 0),
                        reverse=True):  # fmt: skip
        candidate = replace(workload, micro_batch=micro, accumulation=per_process // micro)
        if hardware.holds(estimate(strategy, shape, candidate, hardware.layout, calibration)):
            return micro
    return 0


def what_would_fit(
    shape: ModelShape,
    workload: Workload,
    layout: ParallelLayout,
    gpu_memory_gib: float,
    calibration: Calibration,
    margin: float = DEFAULT_MARGIN,
) -> list[str]:
    """Changes that make some profile fit, cheapest first: a smaller evaluation micro batch where one
    was asked for, a smaller micro batch, checkpointing, more GPUs."""
    suggestions = []

    def first_fitting_half(largest: int, field: str) -> tuple[int, Estimate] | None:
        """The first of largest/2, /4, ... down to 1 at which some profile fits with `field` set to it."""
        batch = largest // 2
        while batch >= 1:
            smaller = replace(workload, **{field: batch})
            found = recommend(plan(shape, smaller, layout, calibration), gpu_memory_gib, margin)
            if found:
                return batch, found
            batch //= 2
        return None

    if fitting := first_fitting_half(workload.eval_micro_batch or 0, "eval_micro_batch"):
        batch, found = fitting
        suggestions.append(
            f"--per_device_eval_batch_size {batch} with {found.profile}: {found.total:.1f} GiB"
        )
    if fitting := first_fitting_half(workload.micro_batch, "micro_batch"):
        batch, found = fitting
        suggestions.append(
            f"--batch_size {batch} --gradient_accumulation_steps {workload.micro_batch // batch} "
            f"(same global batch) with {found.profile}: {found.total:.1f} GiB"
        )
    if not workload.gradient_checkpointing:
        checkpointed = replace(workload, gradient_checkpointing=True)
        found = recommend(plan(shape, checkpointed, layout, calibration), gpu_memory_gib, margin)
        if found:
            suggestions.append(f"--gradient_checkpointing with {found.profile}: {found.total:.1f} GiB")
    for factor in (2, 4, 8):
        more = replace(layout, world_size=layout.world_size * factor)
        found = recommend(plan(shape, workload, more, calibration), gpu_memory_gib, margin)
        if found:
            suggestions.append(f"{more.devices} GPUs with {found.profile}: {found.total:.1f} GiB")
            break
    return suggestions


def format_plan(shape: ModelShape, workload: Workload, estimates: list[Estimate], hardware: Hardware) -> str:
    degree = hardware.layout.sequence_parallel
    split = f" (each sample's tokens split over {degree}: --sequence_parallel)" if degree > 1 else ""
    lines = [
        f"finetune plan: {shape.name} ({shape.parameters:,} parameters), {hardware.gpus} GPU(s) of "
        f"{hardware.gpu_memory_gib:g} GiB, micro batch {workload.micro_batch} x {workload.block_size} tokens"
        f"{split}, {workload.dtype}{', gradient checkpointing' if workload.gradient_checkpointing else ''}, "
        f"{describe_compilation(workload, [e.strategy for e in estimates])}"
        f"{describe_training(shape, workload)}",
        "",
        "| profile | parameters | gradients | optimizer | activations | total / GPU | peaks in | fits "
        "| host RAM / node | NVMe |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in estimates:
        cells = [e.parameters, e.gradients, e.optimizer, e.activations, e.total]
        fits = "yes" if e.fits(hardware.gpu_memory_gib, hardware.margin) else "no"
        host = f"{hardware.host_per_node(e):.1f}" if e.host_per_gpu else ""
        nvme = f"{e.nvme:.1f}" if e.nvme else ""
        lines.append(
            f"| {e.profile} | "
            + " | ".join(f"{value:.2f}" for value in cells)
            + f" | {e.peak} | {fits} | {host} | {nvme} |"
        )
    lines.append("")
    lines.append(
        f"GiB; fits means total <= {100 * (1 - hardware.margin):.0f}% of the GPU's memory; peaks in: the "
        "step's phase that holds the most, or the final evaluation (an optimizer step's buffers count "
        "with the optimizer)."
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class GlobalBatchChoice:
    """How a profile would train `--global_batch_size G`: the run's own choice of micro batch
    (`BatchGeometry.from_global` over `largest_micro_batch_for_share`) and the estimate at it; no
    geometry where not even micro batch 1 fits."""

    strategy: Strategy
    geometry: BatchGeometry | None
    estimate: Estimate | None

    def rank(self, shape: ModelShape, workload: Workload) -> tuple:
        """`--profile auto`'s order, fastest first: the largest micro batch (accumulation only repeats
        it; sharding's memory spent on it ran fsdp_grad_op ahead of ddp's best: docs/speed.md), then the
        profiles' order at that micro batch."""
        micro = self.geometry.micro if self.geometry else 0
        return (-micro, speed_rank(self.strategy, shape, replace(workload, micro_batch=max(micro, 1))))


def global_batch_choices(
    shape: ModelShape,
    workload: Workload,
    strategies: list[Strategy],
    hardware: Hardware,
    calibration: Calibration,
    global_batch: int,
) -> list[GlobalBatchChoice]:
    """Each profile's choice for the global batch, fastest first (`GlobalBatchChoice.rank`)."""
    per_process = BatchGeometry.share_per_process(global_batch, hardware.layout.data_parallel_size)
    choices = []
    for strategy in strategies:
        largest = largest_micro_batch_for_share(strategy, shape, workload, hardware, calibration, per_process)
        if largest < 1:
            choices.append(GlobalBatchChoice(strategy, None, None))
            continue
        geometry, _ = BatchGeometry.from_global(
            global_batch, hardware.layout.data_parallel_size, largest=(largest, "predicted to fit")
        )
        chosen = replace(workload, micro_batch=geometry.micro, accumulation=geometry.accumulation)
        choices.append(
            GlobalBatchChoice(
                strategy, geometry, estimate(strategy, shape, chosen, hardware.layout, calibration)
            )
        )
    return sorted(choices, key=lambda choice: choice.rank(shape, workload))


def format_global_batch(
    shape: ModelShape,
    workload: Workload,
    strategies: list[Strategy],
    hardware: Hardware,
    calibration: Calibration,
    global_batch: int,
) -> str:
    """What `finetune run --global_batch_size G` would train under each profile, chosen as the run
    chooses it: the largest micro batch that divides each GPU's share and is predicted to fit with the
    accumulation the rest makes; fastest first, the first being `--profile auto`'s pick."""
    lines = [
        f"--global_batch_size {global_batch} on {hardware.gpus} GPU(s), as `finetune run` would train it "
        "(fastest first):",
        "",
        "| profile | micro batch | accumulation | total / GPU at that micro batch |",
        "|---|---|---|---|",
    ]
    choices = global_batch_choices(shape, workload, strategies, hardware, calibration, global_batch)
    for choice in choices:
        if choice.geometry is None or choice.estimate is None:
            lines.append(f"| {choice.strategy.name} | does not fit at micro batch 1 | | |")
            continue
        cells = [choice.strategy.name, choice.geometry.micro, choice.geometry.accumulation]
        lines.append(f"| {' | '.join(map(str, cells))} | {choice.estimate.total:.2f} |")
    if choices[0].geometry is not None:
        lines += ["", f"--profile auto with --global_batch_size {global_batch}: {choices[0].strategy.name}"]
    return "\n".join(lines)


def describe_training(shape: ModelShape, workload: Workload) -> str:
    if workload.fp8:
        return f", float8 matmuls (--fp8) in the weights of {shape.float8_weights:,} parameters"
    if workload.peft is None:
        return ""
    adapters = trained_parameters(shape, workload)
    targets = shape.adapter_targets
    layers = "all linear layers" if targets == ALL_LINEAR else f"the layers named {targets}"
    return (
        f", --peft {workload.peft} rank {workload.lora_rank} on {layers}: {adapters:,} trained "
        f"parameters, the base frozen in {workload.dtype}"
    )


def describe_compilation(workload: Workload, strategies: list[Strategy]) -> str:
    if workload.compiled is None:
        compiled = ", ".join(s.name for s in strategies if s.compiled_by_default) or "none"
        rest = "; the rest eager" if any(not s.compiled_by_default for s in strategies) else ""
        return f"torch.compile as run.py does by default ({compiled} compiled{rest})"
    return "torch.compile on" if workload.compiled else "torch.compile off"


def visible_gpu_memory_gib() -> float | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


MICRO_BATCH_WITHOUT_GPU = 8  # --batch_size's default: what a CPU run takes when no memory model applies


def run_workload(
    model_args: Any, data_args: Any, training_args: Any, dtype: str | None = None
) -> tuple[ModelShape, Workload]:
    """The model's shape and the Workload of these run flags, as the planner sees a run: the one
    place run flags become a Workload. `dtype` plans another precision than the flags' (`--precision
    auto` before the launch resolves it)."""
    shape, block_size = shape_of(
        model_args.model,
        model_args.config_overrides,
        data_args.block_size,
        training_args.sequence_parallel,
        model_args.lora_target_modules if model_args.peft else ALL_LINEAR,
    )
    if model_args.peft:
        check_rank(model_args.lora_rank, shape.adapted_narrowest)
    return shape, Workload(
        micro_batch=training_args.per_device_train_batch_size,
        block_size=block_size,
        dtype=dtype or mixed_precision(training_args),
        gradient_checkpointing=training_args.gradient_checkpointing,
        compiled=training_args.torch_compile,
        peft=model_args.peft,
        lora_rank=model_args.lora_rank,
        lora_dropout=model_args.lora_dropout,
        accumulation=training_args.gradient_accumulation_steps,
        chunked_loss=training_args.chunked_loss,
        ddp_bucket_views=training_args.ddp_gradient_as_bucket_view,
        eval_micro_batch=asked_evaluation_micro_batch(training_args),
        fp8=training_args.fp8,
        # the run's launch sets the FSDP profiles' default; a plan of several profiles assumes it
        fsdp_blocks_per_unit=training_args.fsdp_blocks_per_unit or FSDP_BLOCKS_PER_UNIT,
        fsdp_prefetch=training_args.fsdp_prefetch,
    )


def largest_micro_batch_for_run(
    model_args: Any, data_args: Any, training_args: Any, launch: Launch
) -> tuple[int, str]:
    """The largest micro batch the run's model, block, precision and profile are predicted to fit on
    its GPUs, and in words why. Without a GPU (and without --gpu_memory_gib) the memory model,
    calibrated on GPU peaks, does not apply: a CPU run takes at most --batch_size's default."""
    memory = training_args.gpu_memory_gib
    if memory is None and not training_args.use_cpu:
        memory = visible_gpu_memory_gib()
    if memory is None:
        return MICRO_BATCH_WITHOUT_GPU, (
            f"at most {MICRO_BATCH_WITHOUT_GPU}, --batch_size's default: no GPU is visible to plan for "
            "(--gpu_memory_gib plans for one)"
        )
    shape, workload = run_workload(model_args, data_args, training_args)
    strategy = launch.strategy
    hardware = Hardware(launch.layout, memory)
    calibration = measured_calibration()
    per_process = BatchGeometry.share_per_process(training_args.global_batch_size, launch.data_parallel_size)
    largest = largest_micro_batch_for_share(strategy, shape, workload, hardware, calibration, per_process)
    where = f"{strategy.name} on {hardware.gpus} x {memory:g} GiB"
    if largest < 1:
        raise FinetuneError(
            f"--global_batch_size: not even micro batch 1 of {shape.name} is predicted to fit {where} "
            "(`finetune plan` shows what would)"
        )
    alone = largest_micro_batch(strategy, shape, replace(workload, accumulation=1), hardware, calibration)
    held = "" if alone == largest else f"; {alone} alone, without a step's accumulated gradients"
    return largest, f"predicted to fit {where} (finetune plan's memory model{held})"


def apply_global_batch(
    model_args: Any, data_args: Any, training_args: Any, launch: Launch
) -> BatchGeometry | None:
    """`--global_batch_size` made into the run's micro batch and accumulation, logged once.

    Runs after `resolve_launch_settings`, when the processes, precision and compile default are
    known, and before anything reads the batch: the resume check, the run name, the summary.
    """
    if training_args.global_batch_size is None:
        return None
    given = training_args.batch_flags_given
    micro = training_args.per_device_train_batch_size if "per_device_train_batch_size" in given else None
    steps = training_args.gradient_accumulation_steps if "gradient_accumulation_steps" in given else None
    largest = None
    if micro is None and steps is None:
        largest = largest_micro_batch_for_run(model_args, data_args, training_args, launch)
    geometry, reason = BatchGeometry.from_global(
        training_args.global_batch_size, launch.data_parallel_size, micro, steps, largest
    )
    geometry.apply(training_args)
    training_args.batch_choice = reason
    if launch.rank == 0:  # the rank's own number: the devices are not set up yet
        logger.warning(f"finetune: {geometry.describe()}: {reason}")
    return geometry


def choose_profile(
    shape: ModelShape,
    workload: Workload,
    layout: ParallelLayout,
    gpu_memory_gib: float,
    global_batch: int | None = None,
) -> tuple[str, str]:
    """The recommended profile and a one-line reason, for `finetune run --profile auto`: with a
    global batch (and no micro batch given), each profile at the micro batch it would choose."""
    calibration = measured_calibration()
    if global_batch is not None:
        hardware = Hardware(layout, gpu_memory_gib)
        strategies = planned_strategies(None, layout, workload.fp8)
        choices = global_batch_choices(shape, workload, strategies, hardware, calibration, global_batch)
        best_choice = choices[0]
        if best_choice.geometry is not None and best_choice.estimate is not None:
            geometry = best_choice.geometry
            return best_choice.strategy.name, (
                f"for --global_batch_size {global_batch}, the largest micro batch predicted to fit "
                f"({geometry.micro} x accumulation {geometry.accumulation}, "
                f"{best_choice.estimate.total:.1f} of {gpu_memory_gib:.0f} GiB per GPU), fastest first at it"
            )
    best = recommend(plan(shape, workload, layout, calibration), gpu_memory_gib)
    if best is None:
        changes = (
            "; ".join(what_would_fit(shape, workload, layout, gpu_memory_gib, calibration)) or "none found"
        )
        raise FinetuneError(
            f"no profile fits {shape.name} in {layout.devices} x {gpu_memory_gib:.0f} GiB (finetune plan); "
            f"changes that would: {changes or 'none found'}"
        )
    return best.profile, (
        f"the fastest profile predicted to fit: {best.total:.1f} of {gpu_memory_gib:.0f} GiB per GPU"
    )


def plan_frame(shapes: list[ModelShape], gpu_counts: list[int], workload: Workload) -> Any:
    """Predicted GiB per GPU, by model x GPU count x profile, as a pandas DataFrame."""
    import pandas as pd

    calibration = measured_calibration()
    rows = []
    for shape in shapes:
        for gpus in gpu_counts:
            for e in plan(shape, workload, ParallelLayout(gpus), calibration):
                rows.append(
                    {
                        "model": shape.name,
                        "gpus": gpus,
                        "profile": e.profile,
                        "parameters": e.parameters,
                        "gradients": e.gradients,
                        "optimizer": e.optimizer,
                        "activations": e.activations,
                        "total": e.total,
                    }
                )
    return pd.DataFrame(rows)


def measured_vs_predicted() -> Any:
    """Each stored measurement beside the planner's prediction for it."""
    import pandas as pd

    calibration = measured_calibration()
    return pd.DataFrame(
        [
            {
                "model": m.shape.name,
                "profile": m.strategy.name,
                "gpus": m.layout.devices,
                "micro_batch": m.workload.micro_batch,
                "compiled": m.workload.compiled,
                "peft": m.workload.peft,
                "lora_dropout": m.workload.lora_dropout if m.workload.peft else None,
                "measured_gib": m.peak_allocated_gib,
                "predicted_gib": estimate_for(m, calibration).total,
            }
            for m in read_measurements()
        ]
    )
