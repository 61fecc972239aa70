"""The measured peaks the memory model is fitted to and checked against (finetune/calibration.json's
rows, each a Measurement), and the activation coefficients (memory_model.Calibration) fitted to them:
`measured_calibration()` is what every plan predicts with. The states and phases a peak is predicted
from are memory_model.py's; what a step holds beside them, activation_memory.py's."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from finetune.activation_memory import (
    CALIBRATION_FILE,
    CALIBRATION_KINDS,
    COMPILED_LOSS_KINDS,
    activation_gib,
    calibration_kind,
)
from finetune.adapters import DEFAULT_LORA_DROPOUT
from finetune.callbacks import GIB
from finetune.layout import ParallelLayout
from finetune.memory_model import BACKWARD_START, Calibration, Estimate, estimate
from finetune.profiles import Strategy, load_strategy
from finetune.workload import FSDP_BLOCKS_PER_UNIT, ModelShape, Workload


@dataclass(frozen=True)
class Measurement:
    """A measured training peak, with everything needed to predict it again."""

    shape: ModelShape
    workload: Workload
    strategy: Strategy
    layout: ParallelLayout  # the processes it was measured on ("gpus" in calibration.json)
    peak_allocated_gib: float
    forward_activations_gib: float | None = None
    eval_peak_allocated_gib: float | None = None  # the final evaluation's, where it was measured

    @classmethod
    def from_row(cls, row: dict[str, Any], strategy: Strategy) -> Measurement:
        """`strategy` is the row's profile as shipped now; a row says where it ran otherwise
        (`compiled_by_blocks`: single's, ddp's and ZeRO-1/2's rows from when they compiled the whole model;
        `memory_efficient_linear`: ZeRO-3's rows from before the stage-3 JSONs turned DeepSpeed's
        linear off; the workload's `loss_compiled` and `training_logits`: rows from before run.py
        compiled the loss and dropped the training logits)."""
        if "compiled_by_blocks" in row:
            strategy = replace(strategy, compiles_by_blocks=row["compiled_by_blocks"])
        if "memory_efficient_linear" in row:
            strategy = replace(strategy, deepspeed_linear=row["memory_efficient_linear"])
        shape = ModelShape(
            row["model"],
            row["parameters"],
            row["layers"],
            row["hidden"],
            row["vocab"],
            row.get("adapted_in_out", 0),
            row.get("adapted_out", 0),
            row.get("layer_norm", True),
            row.get("gated_mlp", False),
            row.get("intermediate", 0),
            float8_weights=row.get("float8_weights", 0),
        )
        workload = Workload(
            row["micro_batch"],
            row["block_size"],
            row["dtype"],
            row["gradient_checkpointing"],
            row.get("compiled", False),
            row.get("peft"),
            row.get("lora_rank", 16),
            row.get("lora_dropout", DEFAULT_LORA_DROPOUT),
            row.get("gradient_accumulation_steps", 1),
            row.get("loss_compiled", True),
            row.get("chunked_loss", False),
            row.get("ddp_bucket_views", False),
            row.get("training_logits", False),
            row.get("eval_micro_batch"),
            row.get("evaluated_eager"),
            row.get("fp8", False),
            blocks_per_unit(row),
            row.get("fsdp_prefetch", 0),
        )
        return cls(
            shape,
            workload,
            strategy,
            ParallelLayout(row["gpus"], row.get("sequence_parallel", 1)),
            row["peak_allocated_gib"],
            row.get("forward_activations_gib"),
            row.get("eval_peak_allocated_gib"),
        )


def estimate_for(measurement: Measurement, calibration: Calibration) -> Estimate:
    m = measurement
    return estimate(m.strategy, m.shape, m.workload, m.layout, calibration)


def layer_gib_per_byte(shape: ModelShape, workload: Workload) -> float:
    """How many GiB of activations one byte of c_layer stands for."""
    return activation_gib(shape, workload, 1.0) - activation_gib(shape, workload, 0.0)


def blocks_per_unit(row: dict[str, Any]) -> int:
    """A row's transformer blocks per FSDP2 unit: from the units its run recorded, else as the row
    says (runs from before the summary recorded them), else the default since units of several blocks
    were."""
    if "fsdp_units" in row:
        return -(-row["layers"] // row["fsdp_units"])
    return row.get("fsdp_blocks_per_unit", FSDP_BLOCKS_PER_UNIT)


def read_measurements(path: Path = CALIBRATION_FILE, section: str = "measurements") -> list[Measurement]:
    """The measured peaks, each with the strategy of the shipped profile it was measured with.

    `measurements`: one micro batch per step, what the planner is fitted to; `with_accumulation`:
    steps of several micro batches, not fitted to, which check `accumulated_gradient_gib`."""
    return measurements_of(json.loads(path.read_text())[section])


def out_of_memory_runs(path: Path = CALIBRATION_FILE) -> list[tuple[Measurement, float]]:
    """Runs that ran out of GPU memory, each with its GPU's memory in GiB; their peak is the lower
    bound the failed allocation gave."""
    rows = json.loads(path.read_text())["out_of_memory"]
    runs = measurements_of(
        [{**row, "peak_allocated_gib": row["peak_allocated_gib_at_least"]} for row in rows]
    )
    return [(run, row["gpu_memory_gib"]) for run, row in zip(runs, rows, strict=True)]


def measurements_of(rows: list[dict[str, Any]]) -> list[Measurement]:
    strategies = {name: load_strategy(name) for name in {row["profile"] for row in rows}}
    return [Measurement.from_row(row, strategies[row["profile"]]) for row in rows]


def layers_and_logits(rows: list[Measurement], activations: list[float]) -> tuple[float, float]:
    """(c_layer, bytes per logit) that fit the rows' activations (peak less states) best, least
    squares; the rows must mix layers-to-vocabulary ratios (two model shapes), or the two are one."""
    layer_units = [layer_gib_per_byte(m.shape, m.workload) for m in rows]
    logit_units = [m.workload.micro_batch * m.workload.block_size * m.shape.vocab / GIB for m in rows]
    aa = sum(u * u for u in layer_units)
    bb = sum(v * v for v in logit_units)
    ab = sum(u * v for u, v in zip(layer_units, logit_units, strict=True))
    ay = sum(u * y for u, y in zip(layer_units, activations, strict=True))
    by = sum(v * y for v, y in zip(logit_units, activations, strict=True))
    determinant = aa * bb - ab * ab
    if determinant <= 1e-9 * aa * bb:
        raise ValueError(f"{len(rows)} measurement(s) of one shape cannot separate layers from logits")
    return (ay * bb - by * ab) / determinant, (by * aa - ay * ab) / determinant


def fit_calibration(measurements: list[Measurement]) -> Calibration:
    """Least squares of what the measured peaks leave after the model states: through the origin
    for c_layer of the eager-loss kinds on full fine-tuning of models without a gated MLP (their
    logits counted at the eager loss's bytes), c_layer and the bytes per logit together for the
    compiled-loss kinds, then the compiled gated-MLP scale on compiled full fine-tuning of models
    with one, their logits at their kind's bytes.

    The rest check out of sample: eager gated-MLP rows the census' scale, --peft rows the adapter
    accounting, --fp8 rows the float8 census' terms.
    """
    # checkpointing's, the chunked loss's and float8's terms are counted, not fitted: rows check them
    full = [
        m
        for m, w in ((m, m.workload) for m in measurements)
        if w.peft is None and not (w.gradient_checkpointing or w.chunked_loss or w.fp8)
    ]
    eager_loss = Calibration(dict.fromkeys(CALIBRATION_KINDS, 0.0))  # logits at the eager loss's bytes
    states_only = Calibration(eager_loss.layer_bytes, logit_bytes=dict.fromkeys(CALIBRATION_KINDS, 0.0))

    def kind_of(m: Measurement) -> str:
        return calibration_kind(m.strategy, m.workload, m.shape)

    def residual(m: Measurement, calibration: Calibration) -> float:
        """What the peak holds beyond the backward's start's states, where these rows peak (with no
        activations counted, ZeRO-3's optimizer step would be the larger phase)."""
        return m.peak_allocated_gib - estimate_for(m, calibration).phase_totals[BACKWARD_START]

    def through_origin(
        rows: list[Measurement], layer_bytes: dict[str, float], logits: Calibration = eager_loss
    ) -> float:
        """The factor on `layer_bytes` (per kind) that fits the rows' residuals best, their logits
        counted at `logits`' bytes."""
        residuals = [residual(m, logits) for m in rows]
        units = [layer_gib_per_byte(m.shape, m.workload) * layer_bytes[kind_of(m)] for m in rows]
        return sum(r * u for r, u in zip(residuals, units, strict=True)) / sum(u * u for u in units)

    def rows_of(kind: str) -> list[Measurement]:
        rows = [m for m in full if not m.shape.gated_mlp and kind_of(m) == kind]
        if not rows:
            raise ValueError(f"no {kind} measurement to calibrate activations with")
        return rows

    layer_bytes, logit_bytes = {}, {}
    for kind in CALIBRATION_KINDS:
        if kind in COMPILED_LOSS_KINDS:
            rows = rows_of(kind)
            activations = [residual(m, states_only) for m in rows]
            layer_bytes[kind], logit_bytes[kind] = layers_and_logits(rows, activations)
        else:
            layer_bytes[kind] = through_origin(rows_of(kind), dict.fromkeys(CALIBRATION_KINDS, 1.0))
    gated = [m for m in full if m.shape.gated_mlp and kind_of(m) in ("compiled", "whole_compiled")]
    if not gated:
        raise ValueError("no compiled gated-MLP measurement to calibrate activations with")
    logits = Calibration(dict.fromkeys(CALIBRATION_KINDS, 0.0), logit_bytes=logit_bytes)
    return Calibration(layer_bytes, through_origin(gated, layer_bytes, logits), logit_bytes)


def measured_calibration() -> Calibration:
    """The coefficients fitted to every measured peak: what `finetune plan` and a run's checks use."""
    return fit_calibration(read_measurements())
