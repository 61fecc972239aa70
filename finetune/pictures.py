"""The pictures finetune draws: `compare`'s memory, speed and loss curves of each run, and `plan
--picture`'s predicted memory per profile, stacked by what holds it.

matplotlib with its Agg backend (no display needed), imported when a picture is drawn: the commands
that draw none do not pay for it. Each function returns what it drew, read back from the axes, so
tests check a picture's numbers rather than its pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from finetune.memory_model import Estimate


class Row(Protocol):
    """What a comparison bar reads of a run (compare.Row has it; pictures do not import compare)."""

    profile: str
    status: str
    training: str
    memory_kind: str
    peak_memory_gib: float | None
    planned_peak_gib: float | None
    tokens_per_second_per_device: float | None


FULL_COLOUR, ADAPTER_COLOUR = "tab:blue", "tab:orange"
# what a plan's bar is made of, bottom to top, as finetune plan's table names the columns
PLAN_PARTS = ("parameters", "gradients", "optimizer", "activations")
PLAN_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")


def number_text(value: float) -> str:
    """A measured number as the pictures and compare's tables write it."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_label(row: Row) -> str:
    """A bar's name: the profile, and the variant when one was asked for (--variants full,lora)."""
    return f"{row.profile} ({row.training})" if row.training else row.profile


def grouped(rows: list[Row]) -> list[Row]:
    """The rows with each profile's variants together, profiles in the order they were run."""
    order = list(dict.fromkeys(row.profile for row in rows))
    return sorted(rows, key=lambda row: order.index(row.profile))


def comparison_picture(
    rows: list[Row], curves: dict[str, Sequence[tuple[int, float]]], path: Path
) -> dict[str, Any]:
    """Memory and throughput per device, one labelled bar per profile and variant (grouped by
    profile; a run without numbers says why), and below them each run's training loss by step, one
    line per run: the strategies should learn alike, and a line that does not is seen at once. Where
    the measured peak is GPU memory, a mark on its bar shows the planner's prediction for that run.

    `curves`: each run's (step, loss) by its bar's label. Returns {"bars": [(label, memory,
    tokens/s)], "planned": [(label, GiB)], "curves": {label: [(step, loss)]}} as drawn."""
    plt = pyplot()
    rows = grouped(rows)
    labels = [bar_label(row) for row in rows]
    positions = list(range(len(rows)))
    kinds = ", ".join(sorted({row.memory_kind for row in rows if row.memory_kind})) or "no run completed"
    figure = plt.figure(figsize=(11, 0.6 * len(rows) + 5.3))
    grid = figure.add_gridspec(2, 2, height_ratios=[0.6 * len(rows) + 1.3, 4])
    memory_axis, speed_axis = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
    loss_axis = figure.add_subplot(grid[1, :])
    panels = [
        (memory_axis, "peak_memory_gib", f"peak memory per device (GiB, {kinds})"),
        (speed_axis, "tokens_per_second_per_device", "tokens/s per device"),
    ]
    for axis, attribute, title in panels:
        values = [getattr(row, attribute) or 0 for row in rows]
        colours = [FULL_COLOUR if row.training in ("", "full") else ADAPTER_COLOUR for row in rows]
        axis.barh(positions, values, color=colours)
        axis.set_yticks(positions, labels)
        for index, row in enumerate(rows):
            label = number_text(values[index]) if row.status == "completed" else row.status
            axis.text(values[index], index, f" {label}", va="center", fontsize=9)
        axis.set_title(title)
        axis.set_ylim(len(rows) - 0.5, -0.5)  # first row on top, every text inside the axes
        axis.margins(x=0.25)
    planned = [
        (index, row.planned_peak_gib)
        for index, row in enumerate(rows)
        if row.memory_kind == "allocated" and row.planned_peak_gib is not None
    ]
    if planned:  # the measured and the predicted GPU peak of one run, side by side
        memory_axis.plot(
            [gib for _, gib in planned], [index for index, _ in planned], linestyle="none", marker="|",
            markersize=18, markeredgewidth=2, color="black", label="planner's prediction",
        )  # fmt: skip
        memory_axis.legend(fontsize=8, loc="lower right")
    for label in labels:
        curve = curves.get(label) or []
        if curve:
            loss_axis.plot([step for step, _ in curve], [loss for _, loss in curve], label=label, marker=".")
    loss_axis.set_title("training loss by step")
    loss_axis.set_xlabel("step")
    if loss_axis.lines:
        loss_axis.legend(fontsize=9)
    drawn = {
        "bars": [
            (label, memory.get_width(), speed.get_width())
            for label, memory, speed in zip(labels, memory_axis.patches, speed_axis.patches, strict=True)
        ],
        "planned": [
            (labels[round(index)], gib)
            for line in memory_axis.lines
            for gib, index in zip(*line.get_data(), strict=True)
        ],
        "curves": {line.get_label(): list(zip(*line.get_data(), strict=True)) for line in loss_axis.lines},
    }
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return drawn


def plan_picture(
    estimates: list[Estimate], gpu_memory_gib: float, margin: float, title: str, path: Path
) -> list[tuple[str, tuple[float, ...]]]:
    """Each profile's predicted GiB per GPU as one bar stacked by what holds it, with the GPU's
    memory and the planner's usable share of it (less the margin) as lines: which profile fits, and
    what to shard or offload next, in one look. Returns [(profile, part sizes)] as drawn."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(10, 0.45 * len(estimates) + 1.8))
    positions = list(range(len(estimates)))
    left = [0.0] * len(estimates)
    for part, colour in zip(PLAN_PARTS, PLAN_COLOURS, strict=True):
        sizes = [getattr(estimate, part) for estimate in estimates]
        axis.barh(positions, sizes, left=left, color=colour, label=part)
        left = [start + size for start, size in zip(left, sizes, strict=True)]
    for index, total in enumerate(left):
        axis.text(total, index, f" {total:.1f}", va="center", fontsize=9)
    axis.axvline(gpu_memory_gib, color="black", linewidth=1, label=f"GPU memory ({gpu_memory_gib:g} GiB)")
    axis.axvline(
        gpu_memory_gib * (1 - margin), color="black", linestyle="--", linewidth=1,
        label=f"planned limit (margin {margin:.0%})",
    )  # fmt: skip
    axis.set_yticks(positions, [estimate.profile for estimate in estimates])
    axis.set_ylim(len(estimates) - 0.5, -0.5)
    axis.set_xlabel("predicted GiB per GPU")
    axis.set_title(title)
    axis.legend(fontsize=8, loc="lower right")
    drawn = [
        (
            estimate.profile,
            tuple(axis.containers[part].patches[index].get_width() for part in range(len(PLAN_PARTS))),
        )
        for index, estimate in enumerate(estimates)
    ]
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return drawn
