"""FSDP2 units of several consecutive transformer blocks (`--fsdp_blocks_per_unit N`), and the units
whose all-gathers each one issues ahead (`--fsdp_prefetch N`).

accelerate's FSDP2 preparation makes every transformer block its own unit. Each unit costs the host
its hooks (an all-gather issued before its forward and backward, a reduce-scatter after its
backward) whatever its size, and for models of small blocks the host's work per step then exceeds
the GPU's: the GPUs wait for their hosts and the collectives for the last host (docs/speed.md, "why a
small model's sharded step is slow"). N blocks in one unit divide those hooks by N for N times the
unsharded parameters in flight. FSDP2's `fully_shard` takes a list of modules as one unit;
accelerate has no setting for it, so while accelerate prepares the model, its call of `fully_shard`
on a block shards the block's whole group, and accelerate skips the group's other blocks, which are
FSDP modules by then. Written here because neither accelerate nor transformers offers it.

FSDP2 prefetches implicitly: a unit's all-gather is issued when the host reaches that unit's
pre-forward hook (in backward, the reverse of the forward order), so a host behind its GPU issues
each one late and the GPU waits for it. Explicitly, a unit's forward issues the next units'
all-gathers as it starts, while the host is still ahead (torch's `set_modules_to_forward_prefetch`
and `..._backward_prefetch`); accelerate refuses FSDP1's prefetch options under FSDP2 and has
none of its own, so they are set here after accelerate has sharded the model.
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


def units_in_forward_order(model: torch.nn.Module) -> list[Any]:
    """One block of each FSDP2 unit holding the model's transformer blocks, in forward order: the
    blocks of a unit of several share its state ([] when not FSDP2)."""
    units, states = [], set()
    for block in transformer_blocks(model):
        get_state = getattr(block, "_get_fsdp_state", None)
        if get_state is not None and id(get_state()) not in states:
            states.add(id(get_state()))
            units.append(block)
    return units


def count_units(model: torch.nn.Module) -> int:
    """FSDP2 units holding the model's transformer blocks, as sharded (0 when not FSDP2)."""
    return len(units_in_forward_order(model))


def prefetch_units(model: torch.nn.Module, depth: int) -> None:
    """Each unit prefetches the `depth` units after it in forward and the `depth` before it in
    backward, nearest first; depth 0 leaves FSDP2's implicit prefetch."""
    if depth <= 0:
        return
    units = units_in_forward_order(model)
    for index, unit in enumerate(units):
        if following := units[index + 1 : index + 1 + depth]:
            unit.set_modules_to_forward_prefetch(following)
        if preceding := units[max(0, index - depth) : index][::-1]:
            unit.set_modules_to_backward_prefetch(preceding)


def prefetch_depth(model: torch.nn.Module) -> int:
    """The most units any unit prefetches explicitly in forward, as FSDP2 holds it (0: implicit),
    so that the summary says what FSDP2 was told, not what the flag asked."""
    return max(
        (len(unit._get_fsdp_state()._states_to_forward_prefetch) for unit in units_in_forward_order(model)),
        default=0,
    )
