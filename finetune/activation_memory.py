"""What a training step and the run's evaluation hold per GPU beside the model states: the layers'
activations, the loss's logits, the adapters' inputs, the sequence exchange's buffers. Pure functions
of the model's shape, the workload and the strategy, given the bytes a layer keeps per token and
width (c_layer), which finetune/memory_model.py fits to measured peaks.

Activations per GPU are `L·b·T·H·c_layer + b·T·V·(c_logits + 4)` bytes for L layers of width H,
micro batch b, block T and vocabulary V (SDPA attention keeps no T-by-T scores). c_logits = 10: the
bf16 logits (2 bytes), their fp32 copy for the loss (4) and the saved fp32 log-softmax (4); the 4 is
the fp32 gradient of the logits, alive at the start of backward, the peak. These are the eager
loss's bytes, which the eager kinds count. c_layer is fitted to measured full fine-tuning peaks
(finetune/calibration.json, least squares), separately for the ways a layer's activations are held
(CALIBRATION_KINDS): `autocast` (eager torch autocast over fp32 weights or adapters: GPT-2's
LayerNorm and tanh-GELU then run in fp32, a third more than bf16; a model without LayerNorm, such as
an RMSNorm Llama, keeps bf16's), `bf16` (eager, weights held in bf16 without autocast: DeepSpeed,
and FSDP2's mixed precision), `compiled` (torch autocast compiled block by block, the loss beside:
single's and ddp's default; inductor fuses elementwise chains and keeps far fewer intermediates:
docs/planner.md) and `whole_compiled` (the whole model one graph, as ddp, ZeRO-1/2 and single once
ran and a profile without regional compilation runs: fitted as one kind with `compiled`, the
block-by-block runs were over-predicted 1.10-1.12); framework buffers and allocator slack are in
them too. Two more kinds compile the blocks one by one and the loss beside them (run.py's
`--compile_loss`) in bf16 without autocast: `fsdp_compiled` (FSDP2, and ZeRO-1/2's blocks) and
`zero3_compiled` (ZeRO-3's leaf blocks' forwards). A compiled loss keeps fewer bytes a logit than the
eager loss's 14, so for the four compiled kinds the bytes per logit are fitted with c_layer (two
unknowns: rows of models with different layers-to-vocabulary ratios); counted as eager they were
predicted well above their measured peaks, most at long blocks, where the logits are most of a
checkpointed step (docs/planner.md). `--chunked_loss` keeps one chunk of logits whatever the block
(`chunked_loss_buffer_gib`, counted). A model with a gated MLP (Llama, Qwen, Mistral: gate and up
projections, RMSNorm) keeps less per b·T·H than GPT-2 at the same c_layer: eager,
GATED_MLP_ACTIVATION_SCALE, what the CPU census of autograd's saved tensors counted
(docs/planner.md; one shape, intermediate 2.75·H); compiled, `Calibration.compiled_gated_mlp_scale`,
fitted to the compiled Llama peaks measured on GPUs (inductor fuses GPT-2's GELU chain away, less of
SwiGLU's and RMSNorm's, so the census' eager ratio was too low: a micro batch it called fitting ran
out of memory, docs/planner.md). `--fp8` changes what a layer keeps (its matmuls' inputs and weights
kept as float8 casts): `float8_layer_bytes` and `float8_weight_gib`, counted on CPU by the float8
census (docs/planner.md), not fitted. A workload compiles as run.py compiles its strategy by default
(`Strategy.compiled_by_default`: offload eager, the rest compiled); `--torch_compile` overrides it.
With gradient checkpointing each layer keeps only its input, in the residual stream's dtype, and one
layer's activations are live at a time; the step then peaks in one of its phases (`estimate`: the
loss's backward, the last layer's recompute, the backward's end, ZeRO-3's optimizer step), not at
their sum. The run's final evaluation is a phase too (`evaluation_activation_gib`), at the evaluation
micro batch: the training micro batch unless --per_device_eval_batch_size says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune.callbacks import GIB
from finetune.layout import ParallelLayout
from finetune.loss_chunks import CHUNK_LOGITS, VOCAB_ALIGNMENT, tokens_per_chunk
from finetune.profiles import Strategy, keeps_cuda_graphs
from finetune.workload import COMPUTE_BYTES, ModelShape, Workload, trained_parameters

CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration.json"
LOGIT_BYTES = 10
LOGIT_GRADIENT_BYTES = 4
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
CALIBRATION_KINDS = ("autocast", "bf16", "compiled", "whole_compiled", "fsdp_compiled", "zero3_compiled")
# the kinds whose bytes per logit are fitted
COMPILED_LOSS_KINDS = ("compiled", "whole_compiled", "fsdp_compiled", "zero3_compiled")
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
FLOAT8_LAYER_BYTES = MEASURED["float8_layer_bytes"]
FLOAT8_WEIGHT_BYTES = MEASURED["float8_weight_bytes"]


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
    equalled fsdp_grad_op's); single's and ddp's blocks under autocast are `compiled`, and any
    profile compiling the whole model in one graph (`compiles_by_blocks` false) `whole_compiled`.
    Autocast keeps more than bf16 only through LayerNorm (and GPT-2's GELU) running in fp32: a model
    without LayerNorm is bf16's kind."""
    compiled = compiled_for(strategy, workload)
    if framework_of(strategy, workload.dtype) == "deepspeed":
        if strategy.zero_stage in (1, 2) and compiled:
            if not strategy.compiles_by_blocks:
                return "whole_compiled"
            return "fsdp_compiled" if workload.loss_compiled else "compiled"
        # ZeRO-3 compiles its leaf blocks (model_setup.py), adapters' too, unless DeepSpeed's linear makes
        # them recompile until they run eager, keeping bf16's kind
        zero3_blocks = strategy.is_zero3 and compiled and not runs_deepspeed_linear(strategy, shape)
        return "zero3_compiled" if zero3_blocks and workload.loss_compiled else "bf16"
    if compiled:
        if strategy.framework == "fsdp":
            return "fsdp_compiled" if workload.loss_compiled else "compiled"
        return "compiled" if strategy.compiles_by_blocks else "whole_compiled"
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
    Llama's checkpointed long blocks on one GPU were predicted at twice their peak with the eager
    loss's bytes: docs/planner.md)."""
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
    """Whether evaluation runs the eager model: where training is not compiled, or where accelerate's
    compiled copy records CUDA graphs, whose graphs for evaluation's batches held more than the eager
    forward (FinetuneTrainer._wrap_model); a model compiled in place (FSDP2, DeepSpeed) evaluates as it
    trains, graphs or not."""
    if workload.evaluated_eager is not None:
        return workload.evaluated_eager
    compiled = strategy.compiled_by_default if workload.compiled is None else workload.compiled
    if strategy.compiles_in_place:
        return not compiled
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
    # the two torch kinds' checkpointed constants were measured as one (single's blocks, ZeRO-1/2 whole)
    torch_kind = "compiled" if loss_kind_name == "whole_compiled" else loss_kind_name
    logit_bytes = CHECKPOINTED_LOGIT_BYTES.get(torch_kind, LOGIT_BYTES + LOGIT_GRADIENT_BYTES)
    if workload.training_logits and torch_kind == "compiled":
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


def float8_layer_bytes(kind: str, shape: ModelShape, workload: Workload) -> float:
    """What --fp8 changes in the bytes a layer keeps per token and width (negative: fewer): its matmuls
    keep float8 casts of their inputs for the backward where bf16 kept bf16 values. Counted on CPU by
    calibration kind and MLP (calibration.json's float8_layer_bytes says where), not fitted; a kind
    the census did not count is planned as bf16 keeps it, above its peak."""
    if not workload.fp8:
        return 0.0
    return FLOAT8_LAYER_BYTES.get(kind, {}).get(mlp_of(shape), 0.0)


def float8_weight_gib(kind: str, shape: ModelShape, workload: Workload) -> float:
    """What --fp8 changes in what the layers keep of their weights for the backward, per value of the
    weights it converts (float8_weight_bytes: GPT-2's compiled blocks keep each float8 cast, a Llama's
    none; eager, bf16's cast is no longer kept); one layer's with checkpointing. Counted, as
    float8_layer_bytes."""
    if not workload.fp8:
        return 0.0
    weights = shape.float8_weights / (shape.layers if workload.gradient_checkpointing else 1)
    return weights * FLOAT8_WEIGHT_BYTES.get(kind, {}).get(mlp_of(shape), 0.0) / GIB


def mlp_of(shape: ModelShape) -> str:
    """How the float8 census keys a block: GPT-2's (Conv1D, plain MLP) or a gated-MLP model's (nn.Linear)."""
    return "gated_mlp" if shape.gated_mlp else "plain_mlp"


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
