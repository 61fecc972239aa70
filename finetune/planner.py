"""`finetune plan`: predicted memory per GPU for every profile, before anything is launched.

The same model gives a run launched with `--global_batch_size` its micro batch (`apply_global_batch`).

Model states (bytes per parameter Ψ) follow what each framework keeps:

- DeepSpeed with bf16/fp16, the ZeRO paper's mixed-precision Adam: 2Ψ parameters, 2Ψ gradients,
  12Ψ optimizer states (fp32 master weights, momentum, variance). Stage 1 divides the optimizer
  states by the number of GPUs Nd, stage 2 also the gradients, stage 3 also the parameters.
- DDP and FSDP2 under torch autocast keep fp32 parameters and gradients: 4Ψ + 4Ψ + 8Ψ (Adam's two
  moments). FSDP2 full shard divides all three by Nd; FSDP2 without resharding after forward holds
  the gathered parameters from forward to backward, so its parameters count whole.
- What a strategy offloads (`Strategy.offloaded`: the optimizer states, and under stage 3 the
  parameters) moves to host memory or, for ZeRO-Infinity, to the NVMe folder. The CPU (or NVMe)
  Adam step also needs the gradients in fp32 beside its states: 4Ψ more where the optimizer goes
  (16Ψ in all for ZeRO-2-Offload, 18Ψ for ZeRO-3 with parameters offloaded, as DeepSpeed's own
  `estimate_zero*_model_states_mem_needs` count). Host RAM gets DeepSpeed's buffer factor of 1.5
  on top: without it a zero3_offload run predicted to fit was killed for host memory
  (benchmarks/h200-2026-11-24).
- With `--peft lora|dora` (finetune/adapters.py) only the adapters train: gradients and optimizer
  states (and, under DeepSpeed, fp32 masters) are those of the adapter parameters A, counted from
  the layers peft's "all-linear" adapts (r·(in + out) each, DoRA one magnitude per output more).
  The frozen base keeps no master copy: Ψ parameters in the compute dtype (2 bytes in bf16/fp16),
  plus the adapters at the framework's bytes per parameter. Activations are full fine-tuning's
  (the frozen layers still keep their inputs for the gradient that flows through them) plus what
  each adapter keeps of its layer's input (ADAPTER_INPUT_BYTES per adapted input feature and token:
  a cast copy where the adapter's dtype differs from its input's) and, with --lora_dropout, the
  dropout's mask (LORA_DROPOUT_MASK_BYTES); memory snapshots of LoRA steps found both
  (benchmarks/h100-2026-11-25c).
- Host RAM is also taken while the model is built: every process builds the whole fp32 model
  (4Ψ) before it is moved or sharded, except under ZeRO-3, whose `zero.Init` partitions each
  layer as it is created. Host RAM per GPU is the larger of the two.

Activations per GPU are `L·b·T·H·c_layer + b·T·V·(c_logits + 4)` bytes for L layers of width H,
micro batch b, block T and vocabulary V (SDPA attention keeps no T-by-T scores). c_logits = 10:
the bf16 logits (2 bytes), their fp32 copy for the loss (4) and the saved fp32 log-softmax (4);
the 4 is the fp32 gradient of the logits, alive at the start of backward, the peak. These are the
eager loss's bytes: compiled (run.py's `--compile_loss`, wherever it compiles the model) the loss
kept 6 (single) to 8 (FSDP2, ZeRO-3) bytes a logit fewer (benchmarks/h100-2026-11-26). The
calibration rows kept the eager bytes (whole-model compiled ones too), so the planner counts them
and is conservative for compiled-loss runs. c_layer is
fitted to measured full fine-tuning peaks (finetune/calibration.json, least squares), separately
for the three ways a layer's activations are held (CALIBRATION_KINDS): `autocast` (eager torch
autocast over fp32 weights or adapters: GPT-2's LayerNorm and tanh-GELU then run in fp32, a third
more than bf16; a model without LayerNorm, such as an RMSNorm Llama, keeps bf16's), `bf16` (eager,
weights held in bf16 without autocast: DeepSpeed, and FSDP2's mixed precision) and `compiled`
(inductor fuses elementwise chains and keeps far fewer intermediates: benchmarks/h200-2026-11-23b);
framework buffers and allocator slack are in it too. A model with a gated MLP (Llama, Qwen, Mistral:
gate and up projections, RMSNorm) keeps less per b·T·H than GPT-2 at the same c_layer: eager,
GATED_MLP_ACTIVATION_SCALE, what the CPU census of autograd's saved tensors counted
(benchmarks/cpu-2026-11-25-census; one shape, intermediate 2.75·H); compiled,
`Calibration.compiled_gated_mlp_scale`, fitted to the compiled Llama peaks measured on GPUs (inductor
fuses GPT-2's GELU chain away, less of SwiGLU's and RMSNorm's, so the census' eager ratio was too
low: a micro batch it called fitting ran out of memory, benchmarks/h100-2026-11-25d). A workload
compiles as run.py compiles its strategy by default (`Strategy.compiled_by_default`: offload
eager, the rest compiled); `--torch_compile` overrides it. With gradient checkpointing
each layer keeps only its fp32 input (4 bytes per b·T·H) and one layer's activations are live at
a time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.utils import logging

from finetune.adapters import DEFAULT_LORA_DROPOUT, adapted_layer_sizes
from finetune.errors import FinetuneError, first_line
from finetune.launched import BatchGeometry, Launch
from finetune.profiles import (
    OFFLOAD_DEVICES,
    Strategy,
    fastest_first,
    load_strategy,
    shipped_strategies,
)

logger = logging.get_logger("finetune")

GIB = 2**30
CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration.json"
LOGIT_BYTES = 10
LOGIT_GRADIENT_BYTES = 4
CHECKPOINTED_LAYER_BYTES = 4
# Share of GPU memory a plan keeps free: the model's own error. Every measured peak is predicted within
# 15% (tests/test_planner.py), and with 10% kept free the largest micro batch it chose ran out of
# memory twice (calibration.json's out_of_memory).
DEFAULT_MARGIN = 0.15
CALIBRATION_KINDS = ("autocast", "bf16", "compiled")
MAX_MICRO_BATCH = 4096
# What the saved-tensor census counted per b·T·H per layer for the 0.36B Llama against gpt2-medium,
# eager full fine-tuning with bf16 weights (46.1 against 64.1 bytes).
GATED_MLP_ACTIVATION_SCALE = 0.72
# Per adapted input feature and token, by the profile's framework (memory snapshots of gpt2-medium's
# LoRA step, benchmarks/h100-2026-11-25c): under torch autocast the fp32 adapter takes its input cast
# to bf16 once more; under FSDP2 the adapter is bf16 like its input and keeps nothing more; under
# DeepSpeed the bf16 input is cast to the fp32 adapter. In fp32 nothing is cast.
ADAPTER_INPUT_BYTES = {"single": 2, "ddp": 2, "fsdp": 0, "deepspeed": 4}
# With --lora_dropout > 0 the boolean mask; the dropped copy takes the place of the cast one. Measured
# as the difference between dropout 0.05 and 0 peaks: 1.0 to 1.9 bytes (benchmarks/h100-2026-11-25b).
LORA_DROPOUT_MASK_BYTES = 1

OFFLOADED_GRADIENT_BYTES = 4
HOST_BUFFER_FACTOR = 1.5
BUILD_BYTES = 4
FROZEN_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # a frozen weight in the compute dtype, no master copy
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

    @classmethod
    def from_config(cls, name: str, config: PretrainedConfig) -> ModelShape:
        """Counted on the meta device: exact, and free even for billions of parameters."""
        with torch.device("meta"), without_zero3_partitioning():
            model = AutoModelForCausalLM.from_config(config)
        parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        in_out, out = adapted_layer_sizes(model)
        layer_norm = any(type(module) is torch.nn.LayerNorm for module in model.modules())
        gated = any(name.endswith(("gate_proj", "gate_up_proj")) for name, _ in model.named_modules())
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
        )

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


@dataclass(frozen=True)
class Measurement:
    """A measured training peak, with everything needed to predict it again."""

    shape: ModelShape
    workload: Workload
    strategy: Strategy
    gpus: int
    peak_allocated_gib: float
    forward_activations_gib: float | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any], strategy: Strategy) -> Measurement:
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
        )
        return cls(
            shape,
            workload,
            strategy,
            row["gpus"],
            row["peak_allocated_gib"],
            row.get("forward_activations_gib"),
        )


def estimate_for(measurement: Measurement, calibration: Calibration) -> Estimate:
    m = measurement
    return estimate(m.strategy, m.shape, m.workload, m.gpus, calibration)


def layer_gib_per_byte(shape: ModelShape, workload: Workload) -> float:
    """How many GiB of activations one byte of c_layer stands for."""
    return activation_gib(shape, workload, 1.0) - activation_gib(shape, workload, 0.0)


def read_measurements(path: Path = CALIBRATION_FILE, section: str = "measurements") -> list[Measurement]:
    """The measured peaks, each with the strategy of the shipped profile it was measured with.

    `measurements`: one micro batch per step, what the planner models and is fitted to;
    `with_accumulation`: steps of several micro batches, checked only (see calibration.json)."""
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


@dataclass(frozen=True)
class Calibration:
    """Bytes kept per b·T·H per layer, by calibration kind (CALIBRATION_KINDS), and what a compiled
    gated-MLP model keeps against that."""

    layer_bytes: dict[str, float]
    compiled_gated_mlp_scale: float = 1.0

    def layer_bytes_for(self, kind: str, shape: ModelShape) -> float:
        if not shape.gated_mlp:
            scale = 1.0
        elif kind == "compiled":
            scale = self.compiled_gated_mlp_scale
        else:
            scale = GATED_MLP_ACTIVATION_SCALE
        return self.layer_bytes.get(kind, 0.0) * scale

    @classmethod
    def fit(cls, measurements: list[Measurement]) -> Calibration:
        """Least squares through the origin of what the measured peaks leave after states and logits:
        c_layer per kind on full fine-tuning of models without a gated MLP, then the compiled
        gated-MLP scale on compiled full fine-tuning of models with one.

        The rest check out of sample: eager gated-MLP rows the census' scale, --peft rows the adapter
        accounting.
        """
        full = [m for m in measurements if m.workload.peft is None]
        without_layers = cls(dict.fromkeys(CALIBRATION_KINDS, 0.0))

        def kind_of(m: Measurement) -> str:
            return calibration_kind(m.strategy, m.workload, m.shape)

        def through_origin(rows: list[Measurement], layer_bytes: dict[str, float]) -> float:
            """The factor on `layer_bytes` (per kind) that fits the rows' residuals best."""
            residuals = [m.peak_allocated_gib - estimate_for(m, without_layers).total for m in rows]
            units = [layer_gib_per_byte(m.shape, m.workload) * layer_bytes[kind_of(m)] for m in rows]
            return sum(r * u for r, u in zip(residuals, units, strict=True)) / sum(u * u for u in units)

        layer_bytes = {}
        for kind in CALIBRATION_KINDS:
            rows = [m for m in full if not m.shape.gated_mlp and kind_of(m) == kind]
            if not rows:
                raise ValueError(f"no {kind} measurement to calibrate activations with")
            layer_bytes[kind] = through_origin(rows, dict.fromkeys(CALIBRATION_KINDS, 1.0))
        gated = [m for m in full if m.shape.gated_mlp and kind_of(m) == "compiled"]
        if not gated:
            raise ValueError("no compiled gated-MLP measurement to calibrate activations with")
        return cls(layer_bytes, through_origin(gated, layer_bytes))

    @classmethod
    def measured(cls) -> Calibration:
        return cls.fit(read_measurements())


@dataclass
class Estimate:
    strategy: Strategy
    gpus: int
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    host_per_gpu: float = 0.0
    nvme: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def profile(self) -> str:
        return self.strategy.name

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
    """How the layers' activations are held (CALIBRATION_KINDS). DeepSpeed's kind is bf16 also when
    compiled: its compiled peaks were lower (conservative). Autocast keeps more than bf16 only
    through LayerNorm (and GPT-2's GELU) running in fp32: a model without LayerNorm is bf16's kind."""
    if framework_of(strategy, workload.dtype) == "deepspeed":
        return "bf16"
    if compiled_for(strategy, workload):
        return "compiled"
    if strategy.framework == "fsdp" and workload.dtype != "fp32":
        return "bf16"
    return "autocast" if shape.layer_norm else "bf16"


def forward_activation_gib(shape: ModelShape, workload: Workload, layer_bytes: float) -> float:
    """What the forward pass leaves for backward."""
    tokens = workload.micro_batch * workload.block_size
    per_layer = tokens * shape.hidden * layer_bytes
    if workload.gradient_checkpointing:
        layers = shape.layers * tokens * shape.hidden * CHECKPOINTED_LAYER_BYTES + per_layer
    else:
        layers = shape.layers * per_layer
    return (layers + tokens * shape.vocab * LOGIT_BYTES) / GIB


def activation_gib(shape: ModelShape, workload: Workload, layer_bytes: float) -> float:
    """At the peak, the start of backward: the forward's activations and the logits' gradient."""
    tokens = workload.micro_batch * workload.block_size
    return (
        forward_activation_gib(shape, workload, layer_bytes)
        + tokens * shape.vocab * LOGIT_GRADIENT_BYTES / GIB
    )


def adapter_activation_gib(shape: ModelShape, workload: Workload, strategy: Strategy) -> float:
    """What the adapters keep beyond the frozen layers' activations; one layer's with checkpointing."""
    if workload.peft is None:
        return 0.0
    per_feature = 0 if workload.dtype == "fp32" else ADAPTER_INPUT_BYTES[strategy.framework]
    if workload.lora_dropout > 0:
        per_feature += LORA_DROPOUT_MASK_BYTES
    features = shape.adapted_in_out - shape.adapted_out  # adapted input features over all layers
    if workload.gradient_checkpointing:
        features /= shape.layers
    return workload.micro_batch * workload.block_size * features * per_feature / GIB


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


def estimate(
    strategy: Strategy, shape: ModelShape, workload: Workload, gpus: int, calibration: Calibration
) -> Estimate:
    framework = framework_of(strategy, workload.dtype)
    offloaded = strategy.offloaded
    states = {}
    moved = dict.fromkeys(OFFLOAD_DEVICES, 0.0)  # GiB per GPU, by where it goes
    for kind, size in state_bytes(framework, shape, workload).items():
        gib = size / GIB / (gpus if kind in strategy.sharded else 1)
        if kind in offloaded:
            moved[offloaded[kind]] += gib
            gib = 0.0
        states[kind] = gib
    if "optimizer" in offloaded:
        trained = trained_parameters(shape, workload)
        moved[offloaded["optimizer"]] += trained * OFFLOADED_GRADIENT_BYTES / GIB / gpus
    built_whole = 0.0 if "parameters" in strategy.sharded and framework == "deepspeed" else BUILD_BYTES
    host = max(shape.parameters * built_whole / GIB, moved["cpu"] * HOST_BUFFER_FACTOR)
    kind = calibration_kind(strategy, workload, shape)
    layer_bytes = calibration.layer_bytes_for(kind, shape)
    return Estimate(
        strategy=strategy,
        gpus=gpus,
        parameters=states["parameters"],
        gradients=states["gradients"],
        optimizer=states["optimizer"],
        activations=activation_gib(shape, workload, layer_bytes)
        + adapter_activation_gib(shape, workload, strategy),
        host_per_gpu=host,
        nvme=moved["nvme"] * gpus,
    )


def planned_strategies(profiles: list[str] | None, gpus: int) -> list[Strategy]:
    """What to plan, fastest first: the profiles given (names or YAML files, read as any command
    reads them), else every shipped profile that runs on `gpus` processes."""
    if not profiles:
        return [strategy for strategy in shipped_strategies() if strategy.multi_process or gpus == 1]
    strategies = [load_strategy(name) for name in profiles]
    single = [strategy.name for strategy in strategies if not strategy.multi_process]
    if single and gpus > 1:
        raise FinetuneError(f"profile {', '.join(single)} runs one process: plan it with --gpus 1")
    return fastest_first(strategies)


def plan(
    shape: ModelShape,
    workload: Workload,
    gpus: int,
    calibration: Calibration,
    profiles: list[str] | None = None,
) -> list[Estimate]:
    strategies = planned_strategies(profiles, gpus)
    return [estimate(strategy, shape, workload, gpus, calibration) for strategy in strategies]


def recommend(
    estimates: list[Estimate], gpu_memory_gib: float, margin: float = DEFAULT_MARGIN
) -> Estimate | None:
    """The first (fastest) profile that fits with the margin: `plan` orders them fastest first."""
    fitting = [e for e in estimates if e.fits(gpu_memory_gib, margin)]
    return fitting[0] if fitting else None


@dataclass(frozen=True)
class Hardware:
    """What a model must fit in: every GPU's memory and, when known, each node's host RAM."""

    gpus: int
    gpu_memory_gib: float
    host_memory_gib: float | None = None
    gpus_per_node: int | None = None
    margin: float = DEFAULT_MARGIN

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
    keep the GPU busier and ran faster (benchmarks/h200-2026-11-23b)."""
    batch = 0
    while batch < MAX_MICRO_BATCH:
        bigger = replace(workload, micro_batch=batch + 1)
        if not hardware.holds(estimate(strategy, shape, bigger, hardware.gpus, calibration)):
            break
        batch += 1
    return batch


def what_would_fit(
    shape: ModelShape,
    workload: Workload,
    gpus: int,
    gpu_memory_gib: float,
    calibration: Calibration,
    margin: float = DEFAULT_MARGIN,
) -> list[str]:
    """Changes that make some profile fit, cheapest first: smaller micro batch, checkpointing, more GPUs."""
    suggestions = []
    batch = workload.micro_batch // 2
    while batch >= 1:
        smaller = replace(workload, micro_batch=batch)
        found = recommend(plan(shape, smaller, gpus, calibration), gpu_memory_gib, margin)
        if found:
            factor = workload.micro_batch // batch
            suggestions.append(
                f"--batch_size {batch} --gradient_accumulation_steps {factor} (same global batch) "
                f"with {found.profile}: {found.total:.1f} GiB"
            )
            break
        batch //= 2
    if not workload.gradient_checkpointing:
        checkpointed = replace(workload, gradient_checkpointing=True)
        found = recommend(plan(shape, checkpointed, gpus, calibration), gpu_memory_gib, margin)
        if found:
            suggestions.append(f"--gradient_checkpointing with {found.profile}: {found.total:.1f} GiB")
    for more in (gpus * 2, gpus * 4, gpus * 8):
        found = recommend(plan(shape, workload, more, calibration), gpu_memory_gib, margin)
        if found:
            suggestions.append(f"{more} GPUs with {found.profile}: {found.total:.1f} GiB")
            break
    return suggestions


def format_plan(shape: ModelShape, workload: Workload, estimates: list[Estimate], hardware: Hardware) -> str:
    lines = [
        f"finetune plan: {shape.name} ({shape.parameters:,} parameters), {hardware.gpus} GPU(s) of "
        f"{hardware.gpu_memory_gib:g} GiB, micro batch {workload.micro_batch} x {workload.block_size} "
        f"tokens, {workload.dtype}{', gradient checkpointing' if workload.gradient_checkpointing else ''}, "
        f"{describe_compilation(workload, [e.strategy for e in estimates])}"
        f"{describe_training(shape, workload)}",
        "",
        "| profile | parameters | gradients | optimizer | activations | total / GPU | fits "
        "| host RAM / node | NVMe |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in estimates:
        cells = [e.parameters, e.gradients, e.optimizer, e.activations, e.total]
        fits = "yes" if e.fits(hardware.gpu_memory_gib, hardware.margin) else "no"
        host = f"{hardware.host_per_node(e):.1f}" if e.host_per_gpu else ""
        nvme = f"{e.nvme:.1f}" if e.nvme else ""
        lines.append(
            f"| {e.profile} | "
            + " | ".join(f"{value:.2f}" for value in cells)
            + f" | {fits} | {host} | {nvme} |"
        )
    lines.append("")
    lines.append(f"GiB; fits means total <= {100 * (1 - hardware.margin):.0f}% of the GPU's memory.")
    return "\n".join(lines)


def describe_training(shape: ModelShape, workload: Workload) -> str:
    if workload.peft is None:
        return ""
    adapters = trained_parameters(shape, workload)
    return (
        f", --peft {workload.peft} rank {workload.lora_rank} on all linear layers: {adapters:,} trained "
        f"parameters, the base frozen in {workload.dtype}"
    )


def describe_compilation(workload: Workload, strategies: list[Strategy]) -> str:
    if workload.compiled is None:
        compiled = ", ".join(s.name for s in strategies if s.compiled_by_default) or "none"
        return f"torch.compile as run.py does by default ({compiled} compiled; the rest eager)"
    return "torch.compile on" if workload.compiled else "torch.compile off"


def shape_of(model: str, config_overrides: str | None = None) -> tuple[ModelShape, int]:
    """The model's shape and its default block size, from its config alone (no weights)."""
    from finetune.run_flags import ModelArguments
    from finetune.models import choose_block_size, load_config, resolve_model

    model_args = ModelArguments(model=model, config_overrides=config_overrides)
    config = load_config(model_args, resolve_model(model))
    try:  # the model's own constructor checks its shape (heads dividing the width, and so on)
        shape = ModelShape.from_config(model, config)
    except ValueError as error:
        raise FinetuneError(
            f"{model} with --config_overrides {config_overrides}: {first_line(error)}"
        ) from None
    return shape, choose_block_size(None, config)


def visible_gpu_memory_gib() -> float | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


MICRO_BATCH_WITHOUT_GPU = 8  # --batch_size's default: what a CPU run takes when no memory model applies


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
    shape, default_block = shape_of(model_args.model, model_args.config_overrides)
    dtype = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
    workload = Workload(
        1,
        data_args.block_size or default_block,
        dtype,
        training_args.gradient_checkpointing,
        training_args.torch_compile,
        model_args.peft,
        model_args.lora_rank,
        model_args.lora_dropout,
    )
    strategy = launch.strategy
    hardware = Hardware(launch.data_parallel_size, memory)
    largest = largest_micro_batch(strategy, shape, workload, hardware, Calibration.measured())
    where = f"{strategy.name} on {hardware.gpus} x {memory:g} GiB"
    if largest < 1:
        raise FinetuneError(
            f"--global_batch_size: not even micro batch 1 of {shape.name} is predicted to fit {where} "
            "(`finetune plan` shows what would)"
        )
    return largest, f"predicted to fit {where} (at most {largest}; finetune plan's memory model)"


def apply_global_batch(
    model_args: Any, data_args: Any, training_args: Any, launch: Launch
) -> BatchGeometry | None:
    """`--global_batch_size` made into the run's micro batch and accumulation, logged once.

    Runs after `apply_launch_environment`, when the processes, precision and compile default are
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
    if training_args.process_index == 0:
        logger.warning(f"finetune: {geometry.describe()}: {reason}")
    return geometry


def choose_profile(
    shape: ModelShape, workload: Workload, gpus: int, gpu_memory_gib: float
) -> tuple[str, str]:
    """The recommended profile and a one-line reason, for `finetune run --profile auto`."""
    calibration = Calibration.measured()
    estimates = plan(shape, workload, gpus, calibration)
    best = recommend(estimates, gpu_memory_gib)
    if best is None:
        changes = (
            "; ".join(what_would_fit(shape, workload, gpus, gpu_memory_gib, calibration)) or "none found"
        )
        raise FinetuneError(
            f"no profile fits {shape.name} in {gpus} x {gpu_memory_gib:.0f} GiB (finetune plan); "
            f"changes that would: {changes or 'none found'}"
        )
    return best.profile, (
        f"the fastest profile predicted to fit: {best.total:.1f} of {gpu_memory_gib:.0f} GiB per GPU"
    )


# GPT-2 sizes as published (layers, width, heads): plans for them need no config files.
GPT2_SIZES = {
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
}
# Larger GPT-style sizes (GPT-3's 1.3B to 13B with head size 128, OPT's 30B and 66B) on GPT-2's
# architecture, vocabulary and context: the ladder `finetune plan --largest` climbs.
LARGER_GPT_SIZES = {
    "gpt-1.3b": (24, 2048, 16),
    "gpt-2.7b": (32, 2560, 32),
    "gpt-6.7b": (32, 4096, 32),
    "gpt-13b": (40, 5120, 40),
    "gpt-30b": (48, 7168, 56),
    "gpt-66b": (64, 9216, 72),
}
MODEL_LADDER = {**GPT2_SIZES, **LARGER_GPT_SIZES}
LADDER_BLOCK_SIZE = 1024  # their context


@cache
def gpt2_shape(name: str) -> ModelShape:
    """A GPT-2-architecture shape of MODEL_LADDER, counted on the meta device."""
    from transformers import GPT2Config

    layers, width, heads = MODEL_LADDER[name]
    return ModelShape.from_config(name, GPT2Config(n_layer=layers, n_embd=width, n_head=heads))


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
        e = estimate(strategy, gpt2_shape(name), workload, hardware.gpus, calibration)
        if not hardware.holds(e):
            break
        found = (name, e)
    return found


def format_largest(workload: Workload, hardware: Hardware, calibration: Calibration) -> str:
    host = hardware.host_memory_gib
    host_note = f"host RAM {host:g} GiB per node" if host else "host RAM not limited"
    strategies = planned_strategies(None, hardware.gpus)
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


def plan_frame(shapes: list[ModelShape], gpu_counts: list[int], workload: Workload) -> Any:
    """Predicted GiB per GPU, by model x GPU count x profile, as a pandas DataFrame."""
    import pandas as pd

    calibration = Calibration.measured()
    rows = []
    for shape in shapes:
        for gpus in gpu_counts:
            for e in plan(shape, workload, gpus, calibration):
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

    calibration = Calibration.measured()
    return pd.DataFrame(
        [
            {
                "model": m.shape.name,
                "profile": m.strategy.name,
                "gpus": m.gpus,
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
