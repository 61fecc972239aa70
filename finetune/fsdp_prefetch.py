"""FSDP2's explicit prefetch: each transformer block's all-gather issued by the block before it.

FSDP2 prefetches implicitly: a block's all-gather is issued when the host reaches that block's
pre-forward (or pre-backward) hook, so it overlaps the block before only when the host runs ahead
of the GPU. A step whose host is behind (small models: per-block hooks and compiled regions cost
more host time than the GPU's work) then waits on every all-gather in turn. With
`--fsdp_prefetch N`, block i's pre-forward issues the all-gathers of blocks i+1..i+N and its
pre-backward those of blocks i-1..i-N (`FSDPModule.set_modules_to_forward_prefetch` and
`set_modules_to_backward_prefetch`, as PyTorch's FSDP2 example and torchtitan set them), so the GPU
has the next blocks' parameters in flight whatever the host is doing; each block in flight holds its
unsharded parameters, which costs memory. docs/speed.md has the measurements.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's FSDP2 units that are transformer blocks, in the order the forward runs them."""
    from torch.distributed.fsdp import FSDPModule

    block_classes = set(getattr(model, "_no_split_modules", None) or [])

    def is_block(module: torch.nn.Module) -> bool:  # fully_shard subclasses it: FSDPGPT2Block
        return any(cls.__name__ in block_classes for cls in type(module).__mro__)

    return [module for module in model.modules() if isinstance(module, FSDPModule) and is_block(module)]


def set_explicit_prefetch(model: torch.nn.Module, depth: int) -> int:
    """Each block prefetches the next `depth` blocks in forward and the previous `depth` in backward;
    how many blocks were set."""
    blocks = transformer_blocks(model)
    for index, block in enumerate(blocks):
        block.set_modules_to_forward_prefetch(blocks[index + 1 : index + 1 + depth])
        block.set_modules_to_backward_prefetch(blocks[max(0, index - depth) : index][::-1])
    return len(blocks)


class FsdpPrefetch(TrainerCallback):
    """Sets the explicit prefetch once FSDP2 has wrapped the model (the Trainer wraps it in train())."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        if self.depth > 0 and model is not None:
            set_explicit_prefetch(model, self.depth)
