"""What a plan is about: the model's shape, counted from its config on the meta device, and the
workload as run.py would run it (micro batch, block, dtype, checkpointing, compile, adapters, loss,
evaluation, float8). The memory model (finetune/memory_model.py, finetune/activation_memory.py) reads
nothing else of a run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from finetune.adapters import (
    ALL_LINEAR,
    DEFAULT_LORA_DROPOUT,
    adapted_layer_sizes,
    check_targets,
    narrowest_adapted_width,
)
from finetune.float8_layers import float8_weight_count

COMPUTE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # a value in the training dtype
# Transformer blocks per FSDP2 unit under the FSDP profiles (--fsdp_blocks_per_unit): units of 4 were
# faster than one block per unit for gpt2-medium and gpt2-xl on 2 and 4 GPUs, for little more peak
# memory (docs/speed.md, "Two GPUs: FSDP2 units of several blocks").
FSDP_BLOCKS_PER_UNIT = 4


@contextlib.contextmanager
def without_zero3_partitioning() -> Iterator[None]:
    """Build models as if no ZeRO-3 run were configured.

    Once a ZeRO-3 run's TrainingArguments exist, transformers builds every model inside
    `deepspeed.zero.Init`, which partitions (and, without a process group, starts one) and then
    cannot fill meta tensors: `--global_batch_size` under zero3 failed so on a GPU. transformers
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
    adapted_in_out: int = 0  # sum of in + out features over the layers --peft adapts (--lora_target_modules)
    adapted_out: int = 0  # sum of their out features (DoRA's magnitudes)
    layer_norm: bool = True  # nn.LayerNorm, which autocast runs in fp32 (GPT-2); False for RMSNorm models
    gated_mlp: bool = False  # gate and up projections (Llama-style): Calibration.layer_bytes_for
    intermediate: int = 0  # the MLP's inner width; 0 where a shape leaves it out: GPT-2's, 4 x hidden
    adapter_targets: str = ALL_LINEAR  # the --lora_target_modules the adapter sums count
    adapted_narrowest: int = 0  # the highest rank an update of every adapted layer can have
    float8_weights: int = 0  # values in the weights --fp8 multiplies in float8 (finetune/float8_layers.py)

    @classmethod
    def from_config(
        cls, name: str, config: PretrainedConfig, adapter_targets: str = ALL_LINEAR
    ) -> ModelShape:
        """Counted on the meta device: exact, and free even for billions of parameters. The adapter sums
        count the layers `adapter_targets` (--lora_target_modules) names, each name checked as a run
        checks it."""
        with torch.device("meta"), without_zero3_partitioning():
            model = AutoModelForCausalLM.from_config(config)
        parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        check_targets(model, adapter_targets)
        in_out, out = adapted_layer_sizes(model, adapter_targets)
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
            adapter_targets,
            narrowest_adapted_width(model, adapter_targets),
            float8_weight_count(model),
        )

    @property
    def mlp_width(self) -> int:
        return self.intermediate or 4 * self.hidden

    @property
    def block_parameters(self) -> int:
        """One transformer block's parameters: all but the token embedding, spread over the layers.
        The positions' and final norm's few count into the blocks, and so does an output layer not
        tied to the embedding (a block the larger by its share of it): what FSDP2 gathers per unit,
        within a few percent, from the shape's numbers alone."""
        return (self.parameters - self.vocab * self.hidden) // self.layers

    def adapter_parameters(self, peft: str, rank: int) -> int:
        """What `--peft` adds and trains on the shape's adapted layers."""
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
    fp8: bool = False  # --fp8: matmuls in float8 (activation_memory.float8_layer_bytes, float8_weight_gib)
    fsdp_blocks_per_unit: int = FSDP_BLOCKS_PER_UNIT  # what FSDP2 gathers at once (fsdp_unsharded_gib)
    fsdp_prefetch: int = 0  # --fsdp_prefetch: units gathered ahead; 0, FSDP2's implicit one (the same)


def trained_parameters(shape: ModelShape, workload: Workload) -> int:
    """Parameters with gradients and optimizer states: all, or with --peft the adapters only."""
    return (
        shape.parameters
        if workload.peft is None
        else shape.adapter_parameters(workload.peft, workload.lora_rank)
    )
