"""FSDP2 units of several consecutive transformer blocks (`--fsdp_blocks_per_unit N`).

accelerate's FSDP2 preparation makes every transformer block its own unit. Each unit costs the host
its hooks (an all-gather issued before its forward and backward, a reduce-scatter after its
backward) whatever its size, and for models of small blocks the host's work per step then exceeds
the GPU's: the GPUs wait for their hosts and the collectives for the last host (docs/speed.md, "why a
small model's sharded step is slow"). N blocks in one unit divide those hooks by N for N times the
unsharded parameters in flight. FSDP2's `fully_shard` takes a list of modules as one unit;
accelerate has no setting for it, so while accelerate prepares the model, its call of `fully_shard`
on a block shards the block's whole group, and accelerate skips the group's other blocks, which are
FSDP modules by then. Written here because neither accelerate nor transformers offers it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks accelerate wraps one by one: the model's `_no_split_modules`, in forward order (also
    once sharded, when FSDP2 has made each block's class a subclass of its own)."""
    classes = set(getattr(model, "_no_split_modules", None) or [])
    return [module for module in model.modules() if any(c.__name__ in classes for c in type(module).__mro__)]


@contextlib.contextmanager
def blocks_per_unit(model: torch.nn.Module, size: int) -> Iterator[None]:
    """While accelerate prepares `model`, FSDP2 units are groups of `size` consecutive blocks."""
    import torch.distributed.fsdp as fsdp

    blocks = transformer_blocks(model)
    if size <= 1 or not blocks:
        yield
        return
    group_of = {
        id(block): blocks[start : start + size]
        for start in range(0, len(blocks), size)
        for block in blocks[start : start + size]
    }
    shard_one = fsdp.fully_shard

    def shard_group(module: Any, **kwargs: Any) -> Any:
        group = group_of.get(id(module))
        if group is None:
            return shard_one(module, **kwargs)
        shard_one(group, **kwargs)
        return module

    fsdp.fully_shard = shard_group
    try:
        yield
    finally:
        fsdp.fully_shard = shard_one


def count_units(model: torch.nn.Module) -> int:
    """FSDP2 units holding the model's transformer blocks, as sharded (0 when not FSDP2)."""
    states = set()
    for block in transformer_blocks(model):
        get_state = getattr(block, "_get_fsdp_state", None)
        if get_state is not None:
            states.add(id(get_state()))
    return len(states)
