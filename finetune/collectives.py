"""This package's own collective helpers, marked for the watchdog.

Under NCCL a collective returns as soon as it is queued; a rank that arrived waits where the helper
reads the result (`.item()`), in the helper's own frame rather than in torch.distributed's. The
watchdog counts a rank stopped in a marked helper as waiting for the others, as it does one stopped
inside torch.distributed (gloo, which waits there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Function = TypeVar("Function", bound=Callable)
HELPERS: set[str] = set()  # "file in function", as the watchdog writes a frame without its line


def collective(function: Function) -> Function:
    HELPERS.add(f"{function.__code__.co_filename} in {function.__code__.co_name}")
    return function


def in_a_helper(frame: str) -> bool:
    """Whether a frame written as `file:line in function` is inside a marked helper."""
    place, _, function = frame.rpartition(" in ")
    return f"{place.rpartition(':')[0]} in {function}" in HELPERS
