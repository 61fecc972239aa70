"""This package's own collective helpers, marked for the watchdog.

Under NCCL a collective returns as soon as it is queued; a rank that arrived waits where the helper
reads the result (`.item()`), in the helper's own frame rather than in torch.distributed's. The
watchdog counts a rank stopped in a marked helper as waiting for the others, as it does one stopped
inside torch.distributed (gloo, which waits there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

Function = TypeVar("Function", bound=Callable)
HELPERS: set[str] = set()  # "file in function", as the watchdog writes a frame without its line


def collective(function: Function) -> Function:
    HELPERS.add(f"{function.__code__.co_filename} in {function.__code__.co_name}")
    return function


def in_a_helper(frame: str) -> bool:
    """Whether a frame written as `file:line in function` is inside a marked helper."""
    place, _, function = frame.rpartition(" in ")
    return f"{place.rpartition(':')[0]} in {function}" in HELPERS


_host_groups: dict[int, dist.ProcessGroup | None] = {}  # by the default group it was made beside


def host_group() -> dist.ProcessGroup | None:
    """A gloo group of every rank, for agreements between the hosts that need no GPU; None where the
    default group is gloo already. Created at the first call, which every rank makes at the same point.

    An agreement over NCCL is queued behind the step's GPU work, and reading its result (`.item()`)
    makes the host wait for all of that work: at every step, the host could not queue the next step
    while the GPU finished this one (docs/speed.md). Over gloo the hosts agree alone.
    """
    world = id(dist.group.WORLD)
    if world not in _host_groups:
        on_gloo = dist.get_backend() == "gloo"
        _host_groups[world] = None if on_gloo else dist.new_group(backend="gloo")
    return _host_groups[world]


def gather_from_ranks(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (a one-item list when not distributed). Collective."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
