"""How far a profile stretches on given GPUs: the largest model (`finetune plan --largest`) and the
longest block (`finetune plan --longest_block`) the memory model predicts to fit. Both search one
dimension of a workload with the planner's estimate; the planner's own tables plan a given run."""

from __future__ import annotations

from dataclasses import replace

from finetune.memory_model import Calibration, Estimate, estimate
from finetune.model_shapes import GPT2_SIZES, MODEL_LADDER, gpt2_shape
from finetune.planner import Hardware, describe_compilation, planned_strategies
from finetune.profiles import Strategy
from finetune.workload import ModelShape, Workload


def run_flags(name: str) -> str:
    """How `finetune/run.py` trains a ladder shape from scratch."""
    if name in GPT2_SIZES:
        return f"--model {name} --from_scratch"
    layers, width, heads = MODEL_LADDER[name]
    return f"--model gpt2 --config_overrides n_layer={layers},n_embd={width},n_head={heads} --from_scratch"


def largest_model(
    strategy: Strategy, workload: Workload, hardware: Hardware, calibration: Calibration
) -> tuple[str, Estimate] | None:
    """The largest MODEL_LADDER shape this profile is predicted to fit (the offload profiles also
    in host RAM); None when not even the smallest does."""
    found = None
    for name in MODEL_LADDER:
        e = estimate(strategy, gpt2_shape(name), workload, hardware.layout, calibration)
        if not hardware.holds(e):
            break
        found = (name, e)
    return found


def format_largest(
    workload: Workload, hardware: Hardware, calibration: Calibration, profiles: list[str] | None = None
) -> str:
    """`finetune plan --largest`: per profile (`--profiles`, else every one that runs on the GPUs),
    the largest model of the ladder that fits."""
    host = hardware.host_memory_gib
    host_note = f"host RAM {host:g} GiB per node" if host else "host RAM not limited"
    strategies = planned_strategies(profiles, hardware.layout, workload.fp8)
    lines = [
        f"finetune plan --largest: {hardware.gpus} GPU(s) of {hardware.gpu_memory_gib:g} GiB, micro batch "
        f"{workload.micro_batch} x {workload.block_size} tokens, {workload.dtype}, "
        f"{describe_compilation(workload, strategies)}, {host_note}",
        "",
        "| profile | largest model | parameters | total / GPU | host RAM / node | NVMe | run.py flags |",
        "|---|---|---|---|---|---|---|",
    ]
    for strategy in strategies:
        found = largest_model(strategy, workload, hardware, calibration)
        if found is None:
            lines.append(f"| {strategy.name} | none | | | | | |")
            continue
        name, e = found
        host_gib = f"{hardware.host_per_node(e):.1f}" if e.host_per_gpu else ""
        nvme = f"{e.nvme:.1f}" if e.nvme else ""
        lines.append(
            f"| {strategy.name} | {name} | {gpt2_shape(name).parameters:,} | {e.total:.1f} | {host_gib} "
            f"| {nvme} | `{run_flags(name)}` |"
        )
    lines.append("")
    lines.append(
        f"GiB; the ladder: {', '.join(MODEL_LADDER)} (block {workload.block_size}). A prediction, "
        "to be confirmed by a run."
    )
    return "\n".join(lines)


BLOCK_STEP = 1024  # blocks searched in whole multiples of this
LONGEST_SEARCHED_BLOCK = 1 << 22  # tokens a sample: beyond what one GPU's activations hold at batch 1


def longest_block(
    strategy: Strategy,
    shape: ModelShape,
    workload: Workload,
    hardware: Hardware,
    calibration: Calibration,
    context: int | None,
) -> tuple[int, Estimate | None]:
    """The longest block (a multiple of BLOCK_STEP, at most `context`) this profile is predicted to
    fit at the workload's micro batch, with its estimate; (0, None) when not even BLOCK_STEP does.
    Memory grows with the block, so the search halves the range."""

    def at(steps: int) -> Estimate:
        block = replace(workload, block_size=steps * BLOCK_STEP)
        return estimate(strategy, shape, block, hardware.layout, calibration)

    low, high = 0, min(context or LONGEST_SEARCHED_BLOCK, LONGEST_SEARCHED_BLOCK) // BLOCK_STEP
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if hardware.holds(at(middle)) else (low, middle - 1)
    return low * BLOCK_STEP, at(low) if low else None


def format_longest_block(
    shape: ModelShape,
    workload: Workload,
    hardware: Hardware,
    calibration: Calibration,
    context: tuple[int, str] | None,
    profiles: list[str] | None = None,
) -> str:
    """`finetune plan --longest_block`: per profile (`--profiles`, else every one that can run it),
    the longest block of the model that fits."""
    strategies = planned_strategies(profiles, hardware.layout, workload.fp8)
    degree = hardware.layout.sequence_parallel
    split = f", each sample's tokens split over {degree} (--sequence_parallel)" if degree > 1 else ""
    checkpointing = "gradient checkpointing, " if workload.gradient_checkpointing else ""
    lines = [
        f"finetune plan --longest_block: {shape.name}, {hardware.gpus} GPU(s) of {hardware.gpu_memory_gib:g} "
        f"GiB, micro batch {workload.micro_batch}{split}, {workload.dtype}, {checkpointing}"
        f"{describe_compilation(workload, strategies)}",
        "",
        "| profile | longest block | total / GPU at it | run.py flags |",
        "|---|---|---|---|",
    ]
    for strategy in strategies:
        block, e = longest_block(strategy, shape, workload, hardware, calibration, context and context[0])
        if e is None:
            lines.append(f"| {strategy.name} | none | | |")
            continue
        capped = " (the context)" if context and block == context[0] else ""
        lines.append(f"| {strategy.name} | {block:,}{capped} | {e.total:.1f} | `--block_size {block}` |")
    bound = (
        f"up to the model's context ({context[0]:,} tokens, its config's {context[1]}; a rotary model's is "
        "raised with --config_overrides max_position_embeddings=N)"
        if context
        else f"up to {LONGEST_SEARCHED_BLOCK:,}"
    )
    lines += [
        "",
        f"GiB; blocks searched in steps of {BLOCK_STEP} {bound}. A prediction, to be confirmed by a run "
        "(bash benchmarks/run.sh long_context).",
    ]
    return "\n".join(lines)
