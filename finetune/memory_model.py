"""The memory model: the peak memory per GPU (and host RAM, NVMe) of a training step, predicted from
the model's shape, the workload and the strategy. Pure functions of those and of the coefficients
fitted to measured GPU peaks (finetune/calibration.py fits them to calibration.json's rows, which also
holds the model's measured constants); finetune/planner.py builds the commands and tables on it.

Model states (bytes per parameter Ψ) follow what each framework keeps:

- DeepSpeed with bf16/fp16, the ZeRO paper's mixed-precision Adam: 2Ψ parameters, 2Ψ gradients,
  12Ψ optimizer states (fp32 master weights, momentum, variance). Stage 1 divides the optimizer
  states by the number of GPUs Nd, stage 2 also the gradients, stage 3 also the parameters.
- DDP and FSDP2 under torch autocast keep fp32 parameters and gradients: 4Ψ + 4Ψ + 8Ψ (Adam's two
  moments); DDP 4Ψ more, its gradient buckets (`ddp_bucket_gib`). FSDP2 divides all three by Nd
  under both FSDP profiles, and holds bf16 copies of the parameters it gathers beside them
  (`fsdp_unsharded_gib`: without resharding after forward the whole model's from forward to
  backward). ZeRO-3 on several GPUs holds gathered weights up to its reuse distance at the
  backward's start (`gathered_parameter_gib`).
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

What a step and the run's evaluation hold beside the states is counted in
finetune/activation_memory.py; the model's shape and the workload, in finetune/workload.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from finetune.activation_memory import (
    COMPILED_LOSS_KINDS,
    GATED_MLP_ACTIVATION_SCALE,
    LOGIT_BYTES,
    LOGIT_GRADIENT_BYTES,
    MEASURED,
    activation_gib,
    adapter_activation_gib,
    calibration_kind,
    checkpointed_activation_gib,
    chunked_loss_buffer_gib,
    evaluation_activation_gib,
    float8_layer_bytes,
    float8_weight_gib,
    framework_of,
    logits_bytes,
    loss_kind,
    sequence_exchange_gib,
)
from finetune.callbacks import GIB
from finetune.layout import ParallelLayout
from finetune.profiles import OFFLOAD_DEVICES, Strategy
from finetune.workload import COMPUTE_BYTES, ModelShape, Workload, trained_parameters

# ZeRO-3's optimizer step flattens a sub-group's gradients (training dtype) and casts them to fp32
# (stage3.py's _prepare_fp32_grad_for_sub_group): both alive at once, beside every state
SUB_GROUP_STEP_BYTES = 2 + 4
DEFAULT_MARGIN = MEASURED["margin"]  # share of GPU memory a plan keeps free: the model's own error
MAX_MICRO_BATCH = 4096

OFFLOADED_GRADIENT_BYTES = 4
# a step's phases that can hold its peak (`estimate`), as the plan names them
BACKWARD_START, BACKWARD_END, OPTIMIZER_STEP = "backward's start", "backward's end", "optimizer step"
EVALUATION = "evaluation"  # not a step's phase: the run's evaluation, beside the states a step leaves
HOST_BUFFER_FACTOR = MEASURED["host_buffer_factor"]
BUILD_BYTES = 4
FROZEN_BYTES = COMPUTE_BYTES  # a frozen weight in the compute dtype, no master copy
STATE_BYTES = {
    "deepspeed": {"parameters": 2, "gradients": 2, "optimizer": 12},
    "torch": {"parameters": 4, "gradients": 4, "optimizer": 8},
    "fp32": {"parameters": 4, "gradients": 4, "optimizer": 8},
}


@dataclass(frozen=True)
class Calibration:
    """Bytes kept per b·T·H per layer, by calibration kind (CALIBRATION_KINDS), bytes per logit of the
    kinds whose loss is compiled (COMPILED_LOSS_KINDS; the rest keep the eager loss's), and what a
    compiled gated-MLP model keeps against GPT-2's layers: calibration.fit_calibration fits them."""

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
    split 1B Llama's set-up peak held over the unsplit one's (docs/long-context.md)."""
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
    few: gpt2-xl and a 1B Llama checkpointed at micro batch 8 on one GPU (docs/planner.md)."""
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
    process gathers nothing: its partition is the parameter (`_no_gather_coalesced`). gpt2-xl on two
    GPUs held its last blocks' weights whole at its peak (docs/planner.md)."""
    if strategy.gathered_parameter_values is None or layout.shard_group_size <= 1 or strategy.deepcompile:
        return 0.0
    held = min(shape.parameters, strategy.gathered_parameter_values)
    return held * COMPUTE_BYTES[workload.dtype] / GIB


def fsdp_unsharded_gib(
    strategy: Strategy, shape: ModelShape, workload: Workload, layout: ParallelLayout
) -> dict[str, float]:
    """What FSDP2 holds unsharded beside the sharded states, in the compute dtype, at the backward's
    start and end and in the evaluation (nothing under other frameworks).

    FSDP2 keeps the fp32 parameters sharded under both FSDP profiles and gathers them, cast to the
    compute dtype, into buffers of their own, on one process too (its world-of-one unshard copies
    them). Without resharding after forward every unit's stay gathered from its forward into its
    backward, and through an evaluation, which has no backward to reshard them: the whole model. With
    it only the root's are then (the embedding and the other parameters outside the blocks, which
    FSDP2 leaves gathered after the forward), beside, in an evaluation, the unit that runs and the
    next, whose all-gather is issued before the first is freed.

    Once the backward reaches the units, the unit it runs holds its parameters, the gradients it
    makes and the reduce-scatter input of the unit before it in the backward, which FSDP2 keeps until
    the next reduce-scatter (units of --fsdp_blocks_per_unit blocks; with adapters the frozen blocks
    make no gradients to reduce), beside the units prefetched for the backward: the next one
    (FSDP2's implicit prefetch), or --fsdp_prefetch N. Each unit further from the backward's end
    holds one more prefetched unit and one unit's sharded gradients fewer: on more than two
    processes a gathered unit outweighs a shard of its fp32 gradients, and the step peaks with the
    prefetched units in flight, else at the last unit. Counted from torch's FSDP2 code, not fitted:
    the 30B GPT-style model trained under fsdp on four GPUs held 13.4 GiB more than the planner
    counted without them (docs/planner.md, "FSDP2's gathered copies")."""
    if strategy.framework != "fsdp":
        return {}
    value = COMPUTE_BYTES[workload.dtype]
    root = shape.parameters - shape.layers * shape.block_parameters
    per_unit = min(workload.fsdp_blocks_per_unit, shape.layers)
    unit = per_unit * shape.block_parameters
    units = -(-shape.layers // per_unit)
    full = workload.peft is None
    # its weights; with every weight trained its gradients and the earlier unit's reduce input
    at_last_unit = 1 + (1 + int(units > 1) if full else 0)
    prefetched = min(workload.fsdp_prefetch or 1, units - 1)
    # a unit's sharded gradient, in units of the gathered copy, missing for each unit further from the end
    missing_gradients = STATE_BYTES["torch"]["gradients"] / layout.shard_group_size / value if full else 0
    in_flight = at_last_unit + max(0.0, prefetched * (1 - missing_gradients))
    if not strategy.reshard_after_forward:
        start = evaluation = shape.parameters
    else:
        start, evaluation = root, root + min(2 * per_unit, shape.layers) * shape.block_parameters
    return {
        BACKWARD_START: start * value / GIB,
        BACKWARD_END: (root + in_flight * unit) * value / GIB,
        EVALUATION: evaluation * value / GIB,
    }


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
        gib = size / GIB / (layout.shard_group_size if kind in strategy.kept_sharded else 1)
        if kind in offloaded:
            moved[offloaded[kind]] += gib
            gib = 0.0
        states[kind] = gib
    if "optimizer" in offloaded:
        trained = trained_parameters(shape, workload)
        moved[offloaded["optimizer"]] += trained * OFFLOADED_GRADIENT_BYTES / GIB / layout.shard_group_size
    built_whole = 0.0 if "parameters" in strategy.sharded and framework == "deepspeed" else BUILD_BYTES
    host = max(shape.parameters * built_whole / GIB, moved["cpu"] * HOST_BUFFER_FACTOR)
    accumulated = accumulated_gradient_gib(framework, shape, workload)
    states["gradients"] += accumulated
    evaluated = workload  # evaluation gathers the output weight itself: chunked as asked (losses.py)
    if workload.chunked_loss and strategy.gathers_weights_only_in_forward:
        workload = replace(workload, chunked_loss=False)  # trains the model's own loss there
    kind = calibration_kind(strategy, workload, shape)
    layer_bytes = calibration.layer_bytes_for(kind, shape) + float8_layer_bytes(kind, shape, workload)
    float8_weights = float8_weight_gib(kind, shape, workload)
    loss = loss_kind(strategy, workload, shape)
    logit_bytes = calibration.logit_bytes_for(loss)
    split = layout.sequence_parallel
    beside = sequence_exchange_gib(shape, workload, layout, strategy.sequence_split)
    beside += chunked_loss_buffer_gib(shape, workload, layout)
    if workload.gradient_checkpointing:
        held, at_end = checkpointed_activation_gib(shape, workload, strategy, layer_bytes, loss)
        held, at_end = held + float8_weights, at_end + float8_weights
    else:
        held = activation_gib(shape, workload, layer_bytes, logit_bytes)
        held, at_end = held + adapter_activation_gib(shape, workload, strategy) + float8_weights, 0.0
    states["gradients"] += reduce_buffer_gib(strategy, shape, workload, layout, logit_bytes)
    gradients, optimizer = states["gradients"], states["optimizer"]
    # torch makes a step's gradients in its backward, the previous step's freed by `zero_grad`. At the
    # backward's start a checkpointed step of one micro batch holds none, and FSDP2 compiled block by
    # block (its kind, fitted without them) only the earlier micro batches'. The other kinds were
    # fitted counting them: not counting them for single's and ddp's steps moved those rows apart,
    # as if their peaks held something of that size the model does not name otherwise
    # (docs/planner.md, "FSDP2's gathered copies").
    gradients_held = gradients
    if strategy.framework == "fsdp" and kind == "fsdp_compiled":
        gradients_held = accumulated
    elif workload.gradient_checkpointing and strategy.framework != "deepspeed" and workload.accumulation == 1:
        gradients_held = 0.0
    buckets = ddp_bucket_gib(strategy, framework, shape, workload, layout)
    # gradients as views into the buckets are the buckets: no copy beside them once the backward
    # has made them; before it, neither way holds any (the 1B Llama's peak on two GPUs was the
    # same with views, at the backward's start: docs/planner.md)
    gradients = max(gradients, buckets) if workload.ddp_bucket_views else gradients + buckets
    gradients_held += buckets
    step = optimizer_step_gib(strategy, shape, workload, layout)
    parameters = states["parameters"]
    unsharded = fsdp_unsharded_gib(strategy, shape, workload, layout)
    gathered = parameters + gathered_parameter_gib(strategy, shape, workload, layout)
    gathered += unsharded.get(BACKWARD_START, 0.0)
    # torch's gradients are freed by the step's `zero_grad` and ZeRO-1/2's partitions by their step;
    # ZeRO-3's partition and reduce buffers and DDP's buckets stay (each run's allocated memory at the
    # end of training: docs/planner.md)
    gradients_evaluating = (states["gradients"] if strategy.is_zero3 else 0.0) + buckets
    evaluating = evaluation_activation_gib(shape, evaluated, strategy, layout)
    phases = {  # (parameters, gradients, optimizer, activations) at each
        BACKWARD_START: (gathered, gradients_held, optimizer, held / split + beside),
        BACKWARD_END: (
            parameters + unsharded.get(BACKWARD_END, 0.0),
            gradients,
            optimizer,
            at_end / split + beside,
        ),
        OPTIMIZER_STEP: (parameters, gradients, optimizer + step, 0.0),
        EVALUATION: (
            parameters + unsharded.get(EVALUATION, 0.0),
            gradients_evaluating,
            optimizer,
            evaluating,
        ),
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
