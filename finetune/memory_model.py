"""The memory model: the peak memory per GPU (and host RAM, NVMe) of a training step, predicted from
the model's shape, the workload and the strategy. Pure functions of those, fitted to measured GPU
peaks (calibration.json, which also holds the model's measured constants); finetune/planner.py builds
the commands and tables on it.

Model states (bytes per parameter Ψ) follow what each framework keeps:

- DeepSpeed with bf16/fp16, the ZeRO paper's mixed-precision Adam: 2Ψ parameters, 2Ψ gradients,
  12Ψ optimizer states (fp32 master weights, momentum, variance). Stage 1 divides the optimizer
  states by the number of GPUs Nd, stage 2 also the gradients, stage 3 also the parameters.
- DDP and FSDP2 under torch autocast keep fp32 parameters and gradients: 4Ψ + 4Ψ + 8Ψ (Adam's two
  moments); DDP 4Ψ more, its gradient buckets (`ddp_bucket_gib`). FSDP2 full shard divides all
  three by Nd; FSDP2 without resharding after forward holds the gathered parameters from forward to
  backward, so its parameters count whole. ZeRO-3 on several GPUs holds gathered weights up to its
  reuse distance at the backward's start (`gathered_parameter_gib`).
- What a strategy offloads (`Strategy.offloaded`: the optimizer states, and under stage 3 the
  parameters) moves to host memory or, for ZeRO-Infinity, to the NVMe folder. The CPU (or NVMe)
  Adam step also needs the gradients in fp32 beside its states: 4Ψ more where the optimizer goes
  (16Ψ in all for ZeRO-2-Offload, 18Ψ for ZeRO-3 with parameters offloaded, as DeepSpeed's own
  `estimate_zero*_model_states_mem_needs` count). Host RAM gets DeepSpeed's buffer factor of 1.5
  on top: without it a zero3_offload run predicted to fit was killed for host memory
  (docs/planner.md).
- With `--peft lora|dora` (finetune/adapters.py) only the adapters train: gradients and optimizer
  states (and, under DeepSpeed, fp32 masters) are those of the adapter parameters A, counted from
  the layers peft's "all-linear" adapts (r·(in + out) each, DoRA one magnitude per output more).
  The frozen base keeps no master copy: Ψ parameters in the compute dtype (2 bytes in bf16/fp16),
  plus the adapters at the framework's bytes per parameter. Activations are full fine-tuning's
  (the frozen layers still keep their inputs for the gradient that flows through them) plus what
  each adapter keeps of its layer's input (ADAPTER_INPUT_BYTES per adapted input feature and token:
  a cast copy where the adapter's dtype differs from its input's) and, with --lora_dropout, the
  dropout's mask (LORA_DROPOUT_MASK_BYTES); memory snapshots of eager LoRA steps found both
  (docs/planner.md). Compiled layers keep other amounts (COMPILED_ADAPTER_INPUT_BYTES by calibration
  kind, more for a gated-MLP model and under DeepSpeed's linear), read off compiled LoRA peaks.
  DoRA also keeps each adapted layer's two outputs, the frozen layer's and the adapter's, for its
  magnitude's gradient (DORA_OUTPUT_BYTES per adapted output feature and token, by framework eager
  and by calibration kind compiled), read off DoRA peaks.
- Host RAM is also taken while the model is built: every process builds the whole fp32 model
  (4Ψ) before it is moved or sharded, except under ZeRO-3, whose `zero.Init` partitions each
  layer as it is created. Host RAM per GPU is the larger of the two.

Activations per GPU are `L·b·T·H·c_layer + b·T·V·(c_logits + 4)` bytes for L layers of width H,
micro batch b, block T and vocabulary V (SDPA attention keeps no T-by-T scores). c_logits = 10: the
bf16 logits (2 bytes), their fp32 copy for the loss (4) and the saved fp32 log-softmax (4); the 4 is
the fp32 gradient of the logits, alive at the start of backward, the peak. These are the eager
loss's bytes, which the eager kinds count. c_layer is fitted to measured full fine-tuning peaks
(finetune/calibration.json, least squares), separately for the ways a layer's activations are held
(CALIBRATION_KINDS): `autocast` (eager torch autocast over fp32 weights or adapters: GPT-2's
LayerNorm and tanh-GELU then run in fp32, a third more than bf16; a model without LayerNorm, such as
an RMSNorm Llama, keeps bf16's), `bf16` (eager, weights held in bf16 without autocast: DeepSpeed,
and FSDP2's mixed precision) and `compiled` (inductor fuses elementwise chains and keeps far fewer
intermediates: docs/planner.md); framework buffers and allocator slack are in it too. Two more kinds
compile the blocks one by one and the loss beside them (run.py's `--compile_loss`): `fsdp_compiled`
(FSDP2 in bf16, no autocast) and `zero3_compiled` (ZeRO-3's leaf blocks' forwards). Their compiled
loss keeps fewer bytes a logit than the eager loss's 14, and so does `compiled`'s, traced with the
whole model, so for the three the bytes per logit are fitted with c_layer (two unknowns: rows of
models with different layers-to-vocabulary ratios); counted as eager they were predicted well above
their measured peaks, most at long blocks, where the logits are most of a checkpointed step
(docs/planner.md). `--chunked_loss` keeps one chunk of logits whatever the block
(`chunked_loss_buffer_gib`, counted). A model with a gated MLP (Llama, Qwen, Mistral: gate and up
projections, RMSNorm) keeps less per b·T·H than GPT-2 at the same c_layer: eager,
GATED_MLP_ACTIVATION_SCALE, what the CPU census of autograd's saved tensors counted
(docs/planner.md; one shape, intermediate 2.75·H); compiled, `Calibration.compiled_gated_mlp_scale`,
fitted to the compiled Llama peaks measured on GPUs (inductor fuses GPT-2's GELU chain away, less of
SwiGLU's and RMSNorm's, so the census' eager ratio was too low: a micro batch it called fitting ran
out of memory, docs/planner.md). A workload compiles as run.py compiles its strategy by default
(`Strategy.compiled_by_default`: offload eager, the rest compiled); `--torch_compile` overrides it.
With gradient checkpointing each layer keeps only its input, in the residual stream's dtype, and one
layer's activations are live at a time; the step then peaks in one of its phases (`estimate`: the
loss's backward, the last layer's recompute, the backward's end, ZeRO-3's optimizer step), not at
their sum. The run's final evaluation is a phase too (`evaluation_activation_gib`), at the evaluation
micro batch: the training micro batch unless --per_device_eval_batch_size says otherwise.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.utils import logging

from finetune.adapters import DEFAULT_LORA_DROPOUT, adapted_layer_sizes
from finetune.callbacks import GIB
from finetune.layout import ParallelLayout
from finetune.loss_chunks import CHUNK_LOGITS, VOCAB_ALIGNMENT, tokens_per_chunk
from finetune.profiles import (
    OFFLOAD_DEVICES,
    Strategy,
    keeps_cuda_graphs,
    load_strategy,
)

logger = logging.get_logger("finetune")

CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration.json"
LOGIT_BYTES = 10
LOGIT_GRADIENT_BYTES = 4
# ZeRO-3's optimizer step flattens a sub-group's gradients (training dtype) and casts them to fp32
# (stage3.py's _prepare_fp32_grad_for_sub_group): both alive at once, beside every state
SUB_GROUP_STEP_BYTES = 2 + 4
# --chunked_loss (finetune/losses.py) holds one chunk of CHUNK_LOGITS logits at a time: its bf16
# product, the fp32 copy, the fp32 softmax-gradient and that gradient padded in bf16; the output
# weight's gradient in fp32 for the whole step; the hidden states' gradient, one value per token and
# width in the training dtype, kept from forward for backward
CHUNK_BYTES_PER_LOGIT = 2 + 4 + 4 + 2
# evaluation's loss sums (losses.summed_by_chunks) take a chunk's fp32 copy and its exponentials
EVALUATION_CHUNK_BYTES = 4 + 4
CHUNKED_WEIGHT_GRADIENT_BYTES = 4
# The model's measured constants, each with why and where it was measured, are data: calibration.json.
MEASURED = {
    name: entry["value"] for name, entry in json.loads(CALIBRATION_FILE.read_text())["constants"].items()
}
DEFAULT_MARGIN = MEASURED["margin"]  # share of GPU memory a plan keeps free: the model's own error
CALIBRATION_KINDS = ("autocast", "bf16", "compiled", "fsdp_compiled", "zero3_compiled")
COMPILED_LOSS_KINDS = ("compiled", "fsdp_compiled", "zero3_compiled")  # their bytes per logit are fitted
MAX_MICRO_BATCH = 4096
GATED_MLP_ACTIVATION_SCALE = MEASURED["gated_mlp_activation_scale"]
ADAPTER_INPUT_BYTES = MEASURED["adapter_input_bytes"]
COMPILED_ADAPTER_INPUT_BYTES = MEASURED["compiled_adapter_input_bytes"]
COMPILED_GATED_MLP_ADAPTER_BYTES = MEASURED["compiled_gated_mlp_adapter_bytes"]
DEEPSPEED_LINEAR_ADAPTER_BYTES = MEASURED["deepspeed_linear_adapter_bytes"]
CHECKPOINTED_LOGIT_BYTES = MEASURED["checkpointed_logit_bytes"]
RETURNED_LOGIT_BYTES = MEASURED["returned_logit_bytes"]
LORA_DROPOUT_MASK_BYTES = MEASURED["lora_dropout_mask_bytes"]
DORA_OUTPUT_BYTES = MEASURED["dora_output_bytes"]
COMPILED_DORA_OUTPUT_BYTES = MEASURED["compiled_dora_output_bytes"]

OFFLOADED_GRADIENT_BYTES = 4
# a step's phases that can hold its peak (`estimate`), as the plan names them
BACKWARD_START, BACKWARD_END, OPTIMIZER_STEP = "backward's start", "backward's end", "optimizer step"
EVALUATION = "evaluation"  # not a step's phase: the run's evaluation, beside the states a step leaves
HOST_BUFFER_FACTOR = MEASURED["host_buffer_factor"]
BUILD_BYTES = 4
COMPUTE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # a value in the training dtype
FROZEN_BYTES = COMPUTE_BYTES  # a frozen weight in the compute dtype, no master copy
STATE_BYTES = {
    "deepspeed": {"parameters": 2, "gradients": 2, "optimizer": 12},
    "torch": {"parameters": 4, "gradients": 4, "optimizer": 8},
    "fp32": {"parameters": 4, "gradients": 4, "optimizer": 8},
}


@contextlib.contextmanager
def without_zero3_partitioning() -> Iterator[None]:
    """Build models as if no ZeRO-3 run were configured.

    Once a ZeRO-3 run's TrainingArguments exist, transformers builds every model inside
    `deepspeed.zero.Init`, which partitions (and, without a process group, starts one) and then
    cannot fill meta tensors: `--global_batch_size` under zero3 failed so on an H100. transformers
    offers no switch for one build, so its module-level reference is held aside and put back.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    held = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = held


@dataclass(frozen=True)
class ModelShape:
    name: str
    parameters: int
    layers: int
    hidden: int
    vocab: int
    adapted_in_out: int = 0  # sum of in + out features over the layers "all-linear" adapts
    adapted_out: int = 0  # sum of their out features (DoRA's magnitudes)
    layer_norm: bool = True  # nn.LayerNorm, which autocast runs in fp32 (GPT-2); False for RMSNorm models
    gated_mlp: bool = False  # gate and up projections (Llama-style): Calibration.layer_bytes_for
    intermediate: int = 0  # the MLP's inner width; 0 where a shape leaves it out: GPT-2's, 4 x hidden

    @classmethod
    def from_config(cls, name: str, config: PretrainedConfig) -> ModelShape:
        """Counted on the meta device: exact, and free even for billions of parameters."""
        with torch.device("meta"), without_zero3_partitioning():
            model = AutoModelForCausalLM.from_config(config)
        parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        in_out, out = adapted_layer_sizes(model)
        layer_norm = any(type(module) is torch.nn.LayerNorm for module in model.modules())
        gated = any(name.endswith(("gate_proj", "gate_up_proj")) for name, _ in model.named_modules())
        intermediate = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
        return cls(
            name,
            parameters,
            config.num_hidden_layers,
            config.hidden_size,
            config.vocab_size,
            in_out,
            out,
            layer_norm,
            gated,
            intermediate or 4 * config.hidden_size,
        )

    @property
    def mlp_width(self) -> int:
        return self.intermediate or 4 * self.hidden

    def adapter_parameters(self, peft: str, rank: int) -> int:
        """What `--peft` adds and trains with the default targets (all-linear)."""
        return rank * self.adapted_in_out + (self.adapted_out if peft == "dora" else 0)


@dataclass(frozen=True)
class Workload:
    micro_batch: int
    block_size: int
    dtype: str = "bf16"
    gradient_checkpointing: bool = False
    compiled: bool | None = None  # None: as run.py decides per strategy (compiled_by_default)
    peft: str | None = None  # lora or dora: adapters trained on a frozen base; None: every weight
    lora_rank: int = 16
    lora_dropout: float = DEFAULT_LORA_DROPOUT
    accumulation: int = 1  # micro batches per optimizer step (held gradients: accumulated_gradient_gib)
    # the loss compiled beside compiled blocks, as run.py does (--compile_loss); False: runs from
    # before it did, kept in calibration.json as they ran
    loss_compiled: bool = True
    chunked_loss: bool = False  # as asked; under ZeRO-3 `estimate` trains the model's own loss
    ddp_bucket_views: bool = False  # --ddp_gradient_as_bucket_view: DDP's gradients live in its buckets
    # the training forward returned its logits: runs from before run.py dropped them
    # (converters.without_training_logits), kept in calibration.json as they ran
    training_logits: bool = False
    eval_micro_batch: int | None = None  # --per_device_eval_batch_size; None: the training micro batch
    # the evaluation ran the eager model under a compiled training: runs from before it ran the compiled
    # one (FinetuneTrainer._wrap_model), kept in calibration.json as they ran; None: as run.py does now
    evaluated_eager: bool | None = None


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
        (`compiled_by_blocks`: ddp's and ZeRO-1/2's rows from when they compiled the whole model;
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


@dataclass(frozen=True)
class Calibration:
    """Bytes kept per b·T·H per layer, by calibration kind (CALIBRATION_KINDS), bytes per logit of the
    kinds whose loss is compiled (COMPILED_LOSS_KINDS; the rest keep the eager loss's), and what a
    compiled gated-MLP model keeps against GPT-2's layers."""

    layer_bytes: dict[str, float]
    compiled_gated_mlp_scale: float = 1.0
    logit_bytes: dict[str, float] = field(default_factory=dict)

    def layer_bytes_for(self, kind: str, shape: ModelShape) -> float:
        if not shape.gated_mlp:
            scale = 1.0
        elif kind in ("compiled", *COMPILED_LOSS_KINDS):
            scale = self.compiled_gated_mlp_scale
        else:
            scale = GATED_MLP_ACTIVATION_SCALE
        return self.layer_bytes.get(kind, 0.0) * scale

    def logit_bytes_for(self, kind: str) -> float:
        return self.logit_bytes.get(kind, LOGIT_BYTES + LOGIT_GRADIENT_BYTES)

    @classmethod
    def fit(cls, measurements: list[Measurement]) -> Calibration:
        """Least squares of what the measured peaks leave after the model states: through the origin
        for c_layer of the eager-loss kinds on full fine-tuning of models without a gated MLP (their
        logits counted at the eager loss's bytes), c_layer and the bytes per logit together for the
        compiled-loss kinds, then the compiled gated-MLP scale on compiled full fine-tuning of models
        with one, their logits at their kind's bytes.

        The rest check out of sample: eager gated-MLP rows the census' scale, --peft rows the adapter
        accounting.
        """
        # checkpointing's and the chunked loss's terms are counted, not fitted: their rows check them
        full = [
            m
            for m, w in ((m, m.workload) for m in measurements)
            if w.peft is None and not (w.gradient_checkpointing or w.chunked_loss)
        ]
        eager_loss = cls(dict.fromkeys(CALIBRATION_KINDS, 0.0))  # logits at the eager loss's bytes
        states_only = cls(eager_loss.layer_bytes, logit_bytes=dict.fromkeys(CALIBRATION_KINDS, 0.0))

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
        gated = [m for m in full if m.shape.gated_mlp and kind_of(m) == "compiled"]
        if not gated:
            raise ValueError("no compiled gated-MLP measurement to calibrate activations with")
        logits = cls(dict.fromkeys(CALIBRATION_KINDS, 0.0), logit_bytes=logit_bytes)
        return cls(layer_bytes, through_origin(gated, layer_bytes, logits), logit_bytes)

    @classmethod
    def measured(cls) -> Calibration:
        return cls.fit(read_measurements())


def peak_phase(phases: dict[str, tuple[float, ...]]) -> str:
    """The phase that holds the most (BACKWARD_START, BACKWARD_END, OPTIMIZER_STEP, EVALUATION); the
    first of equal totals."""
    return max(phases, key=lambda phase: sum(phases[phase]))


@dataclass
class Estimate:
    strategy: Strategy
    layout: ParallelLayout
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    host_per_gpu: float = 0.0
    nvme: float = 0.0
    # GiB per GPU at each phase: (parameters, gradients, optimizer, activations); the fields above are
    # the peak phase's
    phases: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)

    @property
    def phase_totals(self) -> dict[str, float]:
        return {phase: sum(held) for phase, held in self.phases.items()}

    @property
    def profile(self) -> str:
        return self.strategy.name

    @property
    def peak(self) -> str:
        return peak_phase(self.phases)

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations

    def fits(self, gpu_memory_gib: float, margin: float = DEFAULT_MARGIN) -> bool:
        return self.total <= gpu_memory_gib * (1 - margin)


def framework_of(strategy: Strategy, dtype: str) -> str:
    """Whose bytes per parameter (STATE_BYTES) the model states take."""
    if dtype == "fp32":
        return "fp32"
    return "deepspeed" if strategy.framework == "deepspeed" else "torch"


def compiled_for(strategy: Strategy, workload: Workload) -> bool:
    """Whether run.py compiles this strategy on a GPU: as told, else its compile default."""
    return strategy.compiled_by_default if workload.compiled is None else workload.compiled


def calibration_kind(strategy: Strategy, workload: Workload, shape: ModelShape) -> str:
    """How the layers' activations are held (CALIBRATION_KINDS): ZeRO-1/2 compiled block by block
    as FSDP2's blocks are (bf16 weights without autocast, the loss compiled beside: their peaks
    equalled fsdp_grad_op's), compiled whole as ddp's whole model is. Autocast keeps more than bf16
    only through LayerNorm (and GPT-2's GELU) running in fp32: a model without LayerNorm is bf16's
    kind."""
    compiled = compiled_for(strategy, workload)
    if framework_of(strategy, workload.dtype) == "deepspeed":
        if strategy.zero_stage in (1, 2) and compiled:
            return "fsdp_compiled" if strategy.compiles_by_blocks and workload.loss_compiled else "compiled"
        # ZeRO-3 compiles its leaf blocks (run.py), adapters' too, unless DeepSpeed's linear makes
        # them recompile until they run eager, keeping bf16's kind
        zero3_blocks = strategy.is_zero3 and compiled and not runs_deepspeed_linear(strategy, shape)
        return "zero3_compiled" if zero3_blocks and workload.loss_compiled else "bf16"
    if compiled:
        by_blocks = strategy.framework == "fsdp" and workload.loss_compiled
        return "fsdp_compiled" if by_blocks else "compiled"
    if strategy.framework == "fsdp" and workload.dtype != "fp32":
        return "bf16"
    return "autocast" if shape.layer_norm else "bf16"


def runs_deepspeed_linear(strategy: Strategy, shape: ModelShape) -> bool:
    """Whether ZeRO-3's blocks call DeepSpeed's linear (Strategy.deepspeed_linear): the gated-MLP
    models (Llama, Qwen, Mistral) build their blocks of nn.Linear, whose functional linear DeepSpeed
    replaces; GPT-2's are Conv1D, which it leaves alone. Measured on the 1B and 0.36B Llamas: with it
    their compiled peaks were within bf16's kind, without it within the compiled blocks' kind."""
    return strategy.deepspeed_linear and shape.gated_mlp


def loss_kind(strategy: Strategy, workload: Workload, shape: ModelShape) -> str:
    """Whose bytes per logit the loss keeps: the layers' kind's, but ZeRO-3 compiles its loss beside
    its blocks also where DeepSpeed's linear keeps a gated-MLP model's layers at bf16's kind (a 1B
    Llama's checkpointed long blocks on one GPU were predicted 2.1x their peak with the eager loss's
    bytes)."""
    kind = calibration_kind(strategy, workload, shape)
    zero3_loss_compiled = strategy.is_zero3 and compiled_for(strategy, workload) and workload.loss_compiled
    return "zero3_compiled" if kind == "bf16" and zero3_loss_compiled else kind


def logits_bytes(shape: ModelShape, workload: Workload, logit_bytes: float) -> float:
    """What the loss holds of the logits, at `logit_bytes` a logit: none with --chunked_loss, whose
    one chunk chunked_loss_buffer_gib counts."""
    if workload.chunked_loss:
        return 0.0
    return workload.micro_batch * workload.block_size * shape.vocab * logit_bytes


def hidden_gradient_gib(shape: ModelShape, workload: Workload) -> float:
    """--chunked_loss computes the hidden states' gradient in forward and keeps it for backward, one
    value per token and width in the training dtype (chunked_loss_buffer_gib counts the rest)."""
    if not workload.chunked_loss:
        return 0.0
    return workload.micro_batch * workload.block_size * shape.hidden * COMPUTE_BYTES[workload.dtype] / GIB


def forward_activation_gib(
    shape: ModelShape, workload: Workload, layer_bytes: float, logit_bytes: float = LOGIT_BYTES
) -> float:
    """What the forward pass leaves for backward without checkpointing: every layer's activations
    and the loss's (checkpointed_activation_gib counts a checkpointed step)."""
    tokens = workload.micro_batch * workload.block_size
    layers = shape.layers * tokens * shape.hidden * layer_bytes
    return (layers + logits_bytes(shape, workload, logit_bytes)) / GIB + hidden_gradient_gib(shape, workload)


def evaluation_activation_gib(
    shape: ModelShape, workload: Workload, strategy: Strategy, layout: ParallelLayout
) -> float:
    """What an evaluation holds beside the model states where it peaks: at the output layer
    (`evaluation_output_bytes`) or, where the loss holds little of the logits (--chunked_loss), inside
    a block (`evaluation_block_bytes`). Eager (`evaluates_eager`) under autocast it also holds a copy
    of every weight it has cast, kept until the forward ends. Ulysses splits an evaluation's samples as
    it splits training's; ring attention runs them whole on each rank (FinetuneTrainer). Counted from
    what memory snapshots of evaluations held (docs/planner.md), not fitted."""
    micro = workload.eval_micro_batch or workload.micro_batch
    tokens = micro * workload.block_size
    if strategy.sequence_split == "ulysses":
        tokens /= layout.sequence_parallel
    eager = evaluates_eager(strategy, workload)
    autocast = checkpointed_input_bytes(strategy, workload) != COMPUTE_BYTES[workload.dtype]
    weight_cache = (
        trained_parameters(shape, workload) * COMPUTE_BYTES[workload.dtype] if autocast and eager else 0
    )
    peak = max(
        evaluation_output_bytes(shape, workload, strategy, tokens),
        evaluation_block_bytes(shape, workload, strategy, tokens, eager),
    )
    return (weight_cache + peak) / GIB


def evaluation_output_bytes(
    shape: ModelShape, workload: Workload, strategy: Strategy, tokens: float
) -> float:
    """At the output layer: a micro batch's logits in the compute dtype at the aligned vocabulary
    (`losses.align_output_matmul`; one chunk's with --chunked_loss, which evaluates through
    `losses.chunked_loss_sums`) and the final norm's output in the residual stream's dtype, beside
    either what the output matmul takes (the aligned copy of the output weight and, under autocast
    over fp32 weights, the norm's output cast to the compute dtype) or, once those are freed, one chunk
    of the loss in fp32 (`losses.loss_sums_per_sample`: the forward returns those sums in place of its
    logits, so accelerate's fp32 copy of its outputs copies sums)."""
    compute = COMPUTE_BYTES[workload.dtype]
    stream = checkpointed_input_bytes(strategy, workload)  # fp32 where autocast runs over fp32 weights
    padded_vocab = shape.vocab + -shape.vocab % VOCAB_ALIGNMENT
    norm = tokens * shape.hidden * stream
    if workload.chunked_loss:
        chunk_tokens = tokens_per_chunk("cuda", padded_vocab, shape.hidden)
        return norm + min(tokens, chunk_tokens) * padded_vocab * CHUNK_BYTES_PER_LOGIT
    logits = tokens * padded_vocab * compute
    matmul_inputs = padded_vocab * shape.hidden * stream + (
        tokens * shape.hidden * compute if stream != compute else 0
    )
    loss_chunk = min(tokens * padded_vocab, CHUNK_LOGITS) * EVALUATION_CHUNK_BYTES
    return norm + logits + max(matmul_inputs, loss_chunk)


def evaluation_block_bytes(
    shape: ModelShape, workload: Workload, strategy: Strategy, tokens: float, eager: bool
) -> float:
    """Inside the last block's MLP, where the largest value of an evaluation's forward lives once the
    loss no longer holds the logits. Compiled: the MLP's inner output in the compute dtype (two with a
    gate), two values of the residual stream and two in the compute dtype per token and width. Eager:
    the gate's activation, the up projection and their product (gated), or GPT-2's inner output, its
    tanh-GELU's output and the two intermediates of its `pow`, which autocast runs in fp32; the
    embedding output, two residual values and the norm's output in the stream's dtype, and GPT-2's
    attention output in the compute dtype. Counted from memory snapshots of gpt2-xl and a 1B Llama
    (docs/planner.md), not fitted."""
    compute = COMPUTE_BYTES[workload.dtype]
    stream = checkpointed_input_bytes(strategy, workload)
    autocast = stream != compute
    if not eager:
        inner = (2 if shape.gated_mlp else 1) * compute
        width = 2 * stream + 2 * compute
    elif shape.gated_mlp:
        inner, width = 3 * compute, 4 * stream
    else:
        inner = 2 * compute + 2 * (COMPUTE_BYTES["fp32"] if autocast else compute)
        width = 4 * stream + compute
    return tokens * (shape.mlp_width * inner + shape.hidden * width)


def evaluates_eager(strategy: Strategy, workload: Workload) -> bool:
    """Whether evaluation runs the eager model: where training is not compiled, or where the compiled
    model records CUDA graphs, whose graphs for evaluation's batches held more than the eager forward
    (FinetuneTrainer._wrap_model); FSDP2 and DeepSpeed compile in place, and evaluate what they train."""
    if workload.evaluated_eager is not None:
        return workload.evaluated_eager
    compiled = strategy.compiled_by_default if workload.compiled is None else workload.compiled
    graphs = strategy.records_cuda_graphs and keeps_cuda_graphs(
        workload.gradient_checkpointing, workload.accumulation
    )
    return not compiled or graphs


def checkpointed_input_bytes(strategy: Strategy, workload: Workload) -> int:
    """What a checkpointed layer keeps of its input, per value: the residual stream's dtype. Full
    fine-tuning under single and DDP runs autocast over fp32 weights, and the stream stays fp32;
    FSDP2's mixed precision, DeepSpeed and a frozen base under adapters run the weights, and so the
    stream, in the training dtype (docs/planner.md: checkpointed peaks)."""
    if strategy.framework in ("single", "ddp") and workload.peft is None:
        return COMPUTE_BYTES["fp32"]
    return COMPUTE_BYTES[workload.dtype]


def checkpointed_activation_gib(
    shape: ModelShape, workload: Workload, strategy: Strategy, layer_bytes: float, loss_kind_name: str
) -> tuple[float, float]:
    """A checkpointed step's activations, before the sequence degree divides them, at its two
    candidate peaks: while every layer's input is held, and at the backward's end.

    With every input held the step peaks either in the loss's backward, its logits and their
    gradient alive, or in the last layer's recompute, which starts after the output layer's backward
    has freed them: the larger of the two counts, not their sum. The model's own loss keeps fewer
    bytes a logit here than the fit of unchecked rows gives its kind (CHECKPOINTED_LOGIT_BYTES:
    measured on checkpointed peaks, where the logits are most of the step; RETURNED_LOGIT_BYTES more
    for the compiled kind where the training forward returned its logits). The chunked loss's
    hidden-state gradient is held through the whole backward. At the backward's end the inputs are
    freed and every gradient exists (`estimate` adds them)."""
    tokens = workload.micro_batch * workload.block_size
    inputs = shape.layers * tokens * shape.hidden * checkpointed_input_bytes(strategy, workload) / GIB
    one_layer = tokens * shape.hidden * layer_bytes / GIB + adapter_activation_gib(shape, workload, strategy)
    logit_bytes = CHECKPOINTED_LOGIT_BYTES.get(loss_kind_name, LOGIT_BYTES + LOGIT_GRADIENT_BYTES)
    if workload.training_logits and loss_kind_name == "compiled":
        logit_bytes += RETURNED_LOGIT_BYTES
    loss = logits_bytes(shape, workload, logit_bytes) / GIB
    held = hidden_gradient_gib(shape, workload)
    return inputs + held + max(loss, one_layer), one_layer + held


def chunked_loss_buffer_gib(shape: ModelShape, workload: Workload, layout: ParallelLayout) -> float:
    """What --chunked_loss holds beside a rank's tokens, counted from finetune/losses.py (not fitted):
    one chunk's buffers and the output weight's fp32 gradient, the same for a block of any length
    and on every rank of a sequence group, which is what lets long blocks fit."""
    if not workload.chunked_loss:
        return 0.0
    tokens = workload.micro_batch * workload.block_size / layout.sequence_parallel
    padded_vocab = shape.vocab + -shape.vocab % VOCAB_ALIGNMENT
    chunk_logits = min(tokens, tokens_per_chunk("cuda", padded_vocab, shape.hidden)) * padded_vocab
    weight_gradient = padded_vocab * shape.hidden * CHUNKED_WEIGHT_GRADIENT_BYTES
    return (chunk_logits * CHUNK_BYTES_PER_LOGIT + weight_gradient) / GIB


def activation_gib(
    shape: ModelShape,
    workload: Workload,
    layer_bytes: float,
    logit_bytes: float = LOGIT_BYTES + LOGIT_GRADIENT_BYTES,
) -> float:
    """At the peak, the start of backward: the forward's activations and the logits' gradient
    (`logit_bytes` counts both)."""
    return forward_activation_gib(shape, workload, layer_bytes, logit_bytes)


def sequence_exchange_gib(
    shape: ModelShape, workload: Workload, layout: ParallelLayout, split: str | None = "ulysses"
) -> float:
    """The buffers one layer's attention adds beside a rank's share of the activations (which the
    sequence degree divides), in the training dtype. Ulysses (all-to-all): the query, key and value
    sent and received and the output sent back, each a rank's tokens x the width. Ring attention as
    accelerate configures it (torch's "allgather" rotation): the keys and values of the whole
    sequence gathered, and in backward their gradients, at the full width (keys and values of a
    grouped-query model are repeated to every head before attention). Counted from the mechanisms,
    not fitted."""
    if layout.sequence_parallel == 1 or split is None:
        return 0.0
    width_bytes = shape.hidden * COMPUTE_BYTES[workload.dtype] / GIB
    if split == "ring":
        return 2 * 2 * workload.micro_batch * workload.block_size * width_bytes  # k, v and their gradients
    tokens = workload.micro_batch * workload.block_size / layout.sequence_parallel
    exchanged = 2 * 3 + 2  # q, k, v out and in; the output out and in
    return exchanged * tokens * width_bytes


def adapter_input_bytes(strategy: Strategy, workload: Workload, shape: ModelShape) -> float:
    """What an adapter keeps of each input feature beyond the frozen layer's activations, its dropout
    mask apart. Eager, the cast copy its framework makes (none in fp32); compiled, what the compiled
    LoRA steps were measured to keep, by calibration kind, more for a gated-MLP model (calibration.json
    says where each was measured)."""
    if workload.dtype == "fp32":
        return 0.0
    kind = calibration_kind(strategy, workload, shape)
    if kind not in COMPILED_ADAPTER_INPUT_BYTES:
        return ADAPTER_INPUT_BYTES[adapter_dtype_source(strategy)]
    gated = COMPILED_GATED_MLP_ADAPTER_BYTES if shape.gated_mlp else 0.0
    # the adapters are nn.Linear in any model, so DeepSpeed's linear, where on, runs them
    deepspeed_linear = DEEPSPEED_LINEAR_ADAPTER_BYTES if strategy.deepspeed_linear else 0.0
    return COMPILED_ADAPTER_INPUT_BYTES[kind] + gated + deepspeed_linear


def adapter_activation_gib(shape: ModelShape, workload: Workload, strategy: Strategy) -> float:
    """What the adapters keep beyond the frozen layers' activations; one layer's with checkpointing."""
    if workload.peft is None:
        return 0.0
    per_input = adapter_input_bytes(strategy, workload, shape)
    if workload.lora_dropout > 0:
        per_input += LORA_DROPOUT_MASK_BYTES
    inputs = shape.adapted_in_out - shape.adapted_out  # adapted input features over all layers
    per_output = dora_output_bytes(strategy, workload, shape) if workload.peft == "dora" else 0.0
    per_token = inputs * per_input + shape.adapted_out * per_output
    if workload.gradient_checkpointing:
        per_token /= shape.layers
    return workload.micro_batch * workload.block_size * per_token / GIB


def dora_output_bytes(strategy: Strategy, workload: Workload, shape: ModelShape) -> float:
    """What DoRA keeps of each adapted output feature beyond LoRA: the frozen layer's output and the
    adapter's, for the magnitude's gradient, in the adapter's output dtype (fp32 under ZeRO-3's fp32
    adapters, and everywhere in fp32); compiled, by calibration kind."""
    kind = calibration_kind(strategy, workload, shape)
    if kind in COMPILED_DORA_OUTPUT_BYTES:
        return COMPILED_DORA_OUTPUT_BYTES[kind]
    return DORA_OUTPUT_BYTES["zero3" if workload.dtype == "fp32" else adapter_dtype_source(strategy)]


def adapter_dtype_source(strategy: Strategy) -> str:
    """Whose rule sets the adapters' dtype, which the eager adapter constants are keyed by: DeepSpeed
    casts every parameter of a ZeRO-1/2 model to bf16 when its engine is set up, the adapters too,
    while ZeRO-3's partitioned model keeps them fp32 as peft made them."""
    if strategy.framework != "deepspeed":
        return strategy.framework
    return "zero3" if strategy.is_zero3 else "zero1_2"


def trained_parameters(shape: ModelShape, workload: Workload) -> int:
    """Parameters with gradients and optimizer states: all, or with --peft the adapters only."""
    return (
        shape.parameters
        if workload.peft is None
        else shape.adapter_parameters(workload.peft, workload.lora_rank)
    )


def state_bytes(framework: str, shape: ModelShape, workload: Workload) -> dict[str, float]:
    """Bytes of each model state over the whole model, before sharding or offload."""
    per_parameter = STATE_BYTES[framework]
    if workload.peft is None:
        return {kind: shape.parameters * size for kind, size in per_parameter.items()}
    adapters = trained_parameters(shape, workload)
    frozen = shape.parameters * FROZEN_BYTES[workload.dtype]
    return {
        "parameters": frozen + adapters * per_parameter["parameters"],
        "gradients": adapters * per_parameter["gradients"],
        "optimizer": adapters * per_parameter["optimizer"],
    }


def accumulated_gradient_gib(framework: str, shape: ModelShape, workload: Workload) -> float:
    """Gradients of the earlier micro batches of a step, alive through the next one's forward, where
    a step of one micro batch has none yet (they are freed at the optimizer step and built again in
    the backward). Under torch's DDP and FSDP2 the Trainer skips the gradient sync until the last
    micro batch, so each rank holds them whole, in fp32, beside the sharded ones; DeepSpeed reduces
    every micro batch into its own partitioned buffers (counted in `gradients`). Measured on gpt2-xl
    and a 1B Llama at 2-4 micro batches a step (calibration.json's `with_accumulation`)."""
    if workload.accumulation <= 1 or framework == "deepspeed":
        return 0.0
    return trained_parameters(shape, workload) * STATE_BYTES["torch"]["gradients"] / GIB


def reduce_buffer_gib(
    strategy: Strategy, shape: ModelShape, workload: Workload, layout: ParallelLayout, logit_bytes: float
) -> float:
    """What DeepSpeed's gradient reduce buffers (`profiles.reduce_buffers`) add to the peak, whatever
    the model's size. ZeRO-1/2 allocate theirs, in the training dtype, when the first parameter
    gradient arrives: after the output layer's backward, which has freed the logits and their
    gradient; so they raise the peak only by what they exceed those by (gpt2-medium at micro batch 8
    peaked alike with buckets of 1M and 500M values: docs/speed.md). ZeRO-3 allocates its buffer with
    the optimizer, before the first step, so it is held whole; under sequence parallelism its engine
    reduces in `seq_parallel_communication_data_type` (fp32 by default), twice the bf16 buffer: what a
    split 1B Llama's set-up peak held over the unsplit one's on two H200 (docs/long-context.md)."""
    if not strategy.reduce_buffers:
        return 0.0
    values = strategy.reduce_bucket_values or shape.hidden * shape.hidden  # "auto": transformers' fill
    value_bytes = COMPUTE_BYTES[workload.dtype]
    if strategy.is_zero3 and layout.sequence_parallel > 1:
        value_bytes = strategy.sequence_parallel_gradient_bytes
    buffers = strategy.reduce_buffers * values * value_bytes
    if strategy.is_zero3:
        return buffers / GIB
    return max(0.0, buffers - logits_bytes(shape, workload, logit_bytes)) / GIB


def optimizer_step_gib(
    strategy: Strategy, shape: ModelShape, workload: Workload, layout: ParallelLayout
) -> float:
    """What ZeRO-3's optimizer step adds beside every state on the GPU: one sub-group's gradients,
    flattened and cast to fp32 (SUB_GROUP_STEP_BYTES), a sub-group being at most sub_group_size values
    of a process's partition. Offloaded, the step runs on the CPU. Its peak when the activations are
    few: gpt2-xl and a 1B Llama checkpointed at micro batch 8 on one H200 (docs/planner.md)."""
    if strategy.optimizer_sub_group_values is None or "optimizer" in strategy.offloaded:
        return 0.0
    partition = trained_parameters(shape, workload) / layout.shard_group_size
    return min(partition, strategy.optimizer_sub_group_values) * SUB_GROUP_STEP_BYTES / GIB


def ddp_bucket_gib(
    strategy: Strategy, framework: str, shape: ModelShape, workload: Workload, layout: ParallelLayout
) -> float:
    """DDP's gradient buckets: its Reducer allocates, when the model is wrapped, flat buffers of all
    trained parameters' gradients, held through every phase. Counted, its ddp rows went from
    0.93-0.99 of their peaks to 0.97-1.03 (docs/planner.md). They are allocated with the gradients
    views into them too (`--ddp_gradient_as_bucket_view`): those only spare the gradients' own copy,
    made in the backward (`estimate`). A single process is not wrapped: accelerate runs the ddp
    profile there without DDP (its summary's distributed_type is NO)."""
    if strategy.framework != "ddp" or layout.world_size == 1:
        return 0.0
    return trained_parameters(shape, workload) * STATE_BYTES[framework]["gradients"] / GIB


def gathered_parameter_gib(
    strategy: Strategy, shape: ModelShape, workload: Workload, layout: ParallelLayout
) -> float:
    """ZeRO-3's gathered weights held from the forward into the backward, on several processes:
    DeepSpeed releases a module's gathered parameters after its forward only when their next use (the
    module's own backward) lies more than stage3_max_reuse_distance values ahead, so the last blocks'
    stay whole, in the compute dtype, up to that many values (and stage3_max_live_parameters). One
    process gathers nothing: its partition is the parameter (`_no_gather_coalesced`). gpt2-xl at
    micro batch 8 on two H200 held 30 blocks' weights (0.92e9 values, 1.72 GiB) at its peak
    (docs/planner.md)."""
    if strategy.gathered_parameter_values is None or layout.shard_group_size <= 1 or strategy.deepcompile:
        return 0.0
    held = min(shape.parameters, strategy.gathered_parameter_values)
    return held * COMPUTE_BYTES[workload.dtype] / GIB


def estimate(
    strategy: Strategy,
    shape: ModelShape,
    workload: Workload,
    layout: ParallelLayout,
    calibration: Calibration,
) -> Estimate:
    """A run's peak, from its phases: the forward's activations held at the backward's start (with
    checkpointing, the inputs held through the backward: checkpointed_activation_gib) beside the
    gradients held then; the backward's end, every gradient beside one layer's activations; ZeRO-3's
    optimizer step; the evaluation, beside the states a step leaves. Gradients held at the
    backward's start: DeepSpeed's (partition buffers it keeps from set-up) and those of earlier micro
    batches of the step; torch's others are made in the backward, the previous step's freed by
    `zero_grad`."""
    framework = framework_of(strategy, workload.dtype)
    offloaded = strategy.offloaded
    states = {}
    moved = dict.fromkeys(OFFLOAD_DEVICES, 0.0)  # GiB per GPU, by where it goes
    for kind, size in state_bytes(framework, shape, workload).items():
        gib = size / GIB / (layout.shard_group_size if kind in strategy.sharded else 1)
        if kind in offloaded:
            moved[offloaded[kind]] += gib
            gib = 0.0
        states[kind] = gib
    if "optimizer" in offloaded:
        trained = trained_parameters(shape, workload)
        moved[offloaded["optimizer"]] += trained * OFFLOADED_GRADIENT_BYTES / GIB / layout.shard_group_size
    built_whole = 0.0 if "parameters" in strategy.sharded and framework == "deepspeed" else BUILD_BYTES
    host = max(shape.parameters * built_whole / GIB, moved["cpu"] * HOST_BUFFER_FACTOR)
    states["gradients"] += accumulated_gradient_gib(framework, shape, workload)
    evaluated = workload  # evaluation gathers the output weight itself: chunked as asked (losses.py)
    if workload.chunked_loss and strategy.gathers_weights_only_in_forward:
        workload = replace(workload, chunked_loss=False)  # trains the model's own loss there
    kind = calibration_kind(strategy, workload, shape)
    layer_bytes = calibration.layer_bytes_for(kind, shape)
    loss = loss_kind(strategy, workload, shape)
    logit_bytes = calibration.logit_bytes_for(loss)
    split = layout.sequence_parallel
    beside = sequence_exchange_gib(shape, workload, layout, strategy.sequence_split)
    beside += chunked_loss_buffer_gib(shape, workload, layout)
    if workload.gradient_checkpointing:
        held, at_end = checkpointed_activation_gib(shape, workload, strategy, layer_bytes, loss)
    else:
        held = activation_gib(shape, workload, layer_bytes, logit_bytes)
        held, at_end = held + adapter_activation_gib(shape, workload, strategy), 0.0
    states["gradients"] += reduce_buffer_gib(strategy, shape, workload, layout, logit_bytes)
    gradients, optimizer = states["gradients"], states["optimizer"]
    gradients_held = gradients  # unchecked, as the layer bytes were fitted counting them
    # whose the gradients are, not whose bytes they take: DeepSpeed keeps its partitions in fp32 too
    if workload.gradient_checkpointing and strategy.framework != "deepspeed" and workload.accumulation == 1:
        gradients_held = 0.0
    buckets = ddp_bucket_gib(strategy, framework, shape, workload, layout)
    # gradients as views into the buckets are the buckets: no copy beside them once the backward
    # has made them; before it, neither way holds any (the 1B Llama's peak on two H200 was the
    # same with views, at the backward's start: docs/planner.md)
    gradients = max(gradients, buckets) if workload.ddp_bucket_views else gradients + buckets
    gradients_held += buckets
    step = optimizer_step_gib(strategy, shape, workload, layout)
    parameters = states["parameters"]
    gathered = parameters + gathered_parameter_gib(strategy, shape, workload, layout)
    # torch's gradients are freed by the step's `zero_grad` and ZeRO-1/2's partitions by their step;
    # ZeRO-3's partition and reduce buffers and DDP's buckets stay (each run's allocated memory at the
    # end of training: docs/planner.md)
    gradients_evaluating = (states["gradients"] if strategy.is_zero3 else 0.0) + buckets
    evaluating = evaluation_activation_gib(shape, evaluated, strategy, layout)
    phases = {  # (parameters, gradients, optimizer, activations) at each
        BACKWARD_START: (gathered, gradients_held, optimizer, held / split + beside),
        BACKWARD_END: (parameters, gradients, optimizer, at_end / split + beside),
        OPTIMIZER_STEP: (parameters, gradients, optimizer + step, 0.0),
        EVALUATION: (parameters, gradients_evaluating, optimizer, evaluating),
    }
    parameters, gradients, optimizer, activations = phases[peak_phase(phases)]
    return Estimate(
        strategy=strategy,
        layout=layout,
        parameters=parameters,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        host_per_gpu=host,
        nvme=moved["nvme"] * layout.devices,
        phases=phases,
    )
