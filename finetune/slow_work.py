"""Work one rank does while the others wait, without a collective timeout cutting it short.

Data preparation (tokenizing, packing) runs on each machine's first rank, then the others read its
cache. transformers' `main_process_first` makes them wait in a barrier, a collective: a tokenization
longer than the collective timeout (`--ddp_timeout`, and NCCL's watchdog) kills the run. Here they
wait on a file on the machine instead, which has no time limit; the launcher still ends them if the
first rank fails.

Saves (a checkpoint, the final model) gather and write the whole model on one rank while the others
wait in a barrier: the process group's timeout is raised for the save to what a slow disk needs for
the model's size, then put back (torch's `_set_pg_timeout`, the one way to change a live group's
timeout).
"""

from __future__ import annotations

import atexit
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path

import psutil
import torch.distributed as dist

POLL_S = 0.5
SLOWEST_DISK_BYTES_PER_S = 50e6  # the slowest disk a save should survive: a network file system under load


MARKER = re.compile(r"finetune-.+-(?P<pid>\d+)-(?P<started>\d+)\.ready")


def launch_identity(pid: int) -> str:
    """The launcher process as `PID-START`: every rank of a machine shares its launcher (torch's
    elastic agent) as parent, and its start time (centiseconds since the epoch) tells a recycled
    PID apart. A launcher killed outright leaves its marker behind, and a later one given the same
    PID (a container starts each job's processes alike) must not take that marker as its own."""
    return f"{pid}-{round(psutil.Process(pid).create_time() * 100)}"


def ready_marker(description: str) -> Path:
    """A file of this machine, one per launch."""
    name = f"finetune-{description.replace(' ', '-')}-{launch_identity(os.getppid())}.ready"
    return Path(tempfile.gettempdir()) / name


def remove_markers_of_ended_launches() -> None:
    """Markers whose launcher no longer runs: those of launches killed before they could clean up."""
    for path in Path(tempfile.gettempdir()).glob("finetune-*.ready"):
        found = MARKER.fullmatch(path.name)
        if found is None:
            continue
        try:
            if launch_identity(int(found["pid"])) == f"{found['pid']}-{found['started']}":
                continue
        except psutil.AccessDenied:  # another user's process: not ours to judge
            continue
        except psutil.NoSuchProcess:
            pass
        with suppress(OSError):  # another user's file in the shared folder
            path.unlink(missing_ok=True)


@contextmanager
def machine_first_rank_first(local_rank: int, local_world_size: int, description: str) -> Iterator[None]:
    """The machine's first rank runs the body first; the others run it once that one has, waiting
    on a file rather than in a collective."""
    marker = ready_marker(description)
    if local_world_size <= 1:
        yield
        return
    if local_rank == 0:
        remove_markers_of_ended_launches()
        yield
        marker.touch()
        atexit.register(marker.unlink, missing_ok=True)
        return
    parent = os.getppid()
    while not marker.exists():
        if os.getppid() != parent:  # the launcher is gone: nobody will prepare the data
            raise RuntimeError(f"{description}: the launcher exited while this rank waited")
        time.sleep(POLL_S)
    yield


def save_timeout(checkpoint_bytes: int, configured_s: float) -> timedelta:
    """The run's collective timeout plus the time the slowest disk takes to write the checkpoint."""
    return timedelta(seconds=configured_s + checkpoint_bytes / SLOWEST_DISK_BYTES_PER_S)


@contextmanager
def timeout_for_save(checkpoint_bytes: int, configured_s: float) -> Iterator[None]:
    """The default process group's timeout raised for a save of this size, then restored."""
    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    dist.distributed_c10d._set_pg_timeout(save_timeout(checkpoint_bytes, configured_s))
    try:
        yield
    finally:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=configured_s))
