"""Work one rank does while the others wait, without a collective timeout cutting it short.

Data preparation (tokenizing, packing) runs on each machine's first rank, then the others read its
cache. transformers' `main_process_first` makes them wait in a barrier, a collective: a tokenization
longer than the collective timeout (`--ddp_timeout`, and NCCL's watchdog) kills the run. Here they
wait for a file instead, which has no time limit; the launcher still ends them if the first rank
fails. The file lies in the run's own output_dir (finetune/run_folder.py), not in a folder every user
of the machine shares, where anyone could plant or block it.

Saves (a checkpoint, the final model) gather and write the whole model on one rank while the others
wait in a barrier: the process group's timeout is raised for the save to what a slow disk needs for
the model's size, then put back (torch's `_set_pg_timeout`, the one way to change a live group's
timeout).
"""

from __future__ import annotations

import atexit
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path

import psutil
import torch.distributed as dist

from finetune.run_folder import READY_MARKER, ready_marker_folder

POLL_S = 0.5
SLOWEST_DISK_BYTES_PER_S = 50e6  # the slowest disk a save should survive: a network file system under load


def launcher_of(pid: int) -> tuple[int, int]:
    """A launcher process as (PID, start in centiseconds since the epoch): every rank of a machine
    shares its launcher (torch's elastic agent) as parent, and the start time tells a recycled PID
    apart. A launch killed outright leaves its marker behind, and a later launcher given the same
    PID (a container starts each job's processes alike) must not take that marker as its own."""
    return pid, round(psutil.Process(pid).create_time() * 100)


def ready_marker(output_dir: str | Path, description: str) -> Path:
    """This launch's marker on this machine (a shared output_dir holds every machine's)."""
    pid, started = launcher_of(os.getppid())
    name = READY_MARKER.format(
        what=description.replace(" ", "-"), pid=pid, started=started, host=socket.gethostname()
    )
    return ready_marker_folder(output_dir) / name


def remove_markers_of_ended_launches(output_dir: str | Path) -> None:
    """This machine's markers whose launcher no longer runs: those of launches killed before they
    could clean up (another machine's are that machine's to judge)."""
    this_machine = READY_MARKER.format(what="*", pid="*", started="*", host=socket.gethostname())
    for path in ready_marker_folder(output_dir).glob(this_machine):
        pid, started = path.name.rsplit("@", 1)[0].rsplit("-", 2)[1:]
        try:
            if launcher_of(int(pid)) == (int(pid), int(started)):
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):  # ended, or not ours
            pass
        with suppress(OSError):
            path.unlink(missing_ok=True)


@contextmanager
def machine_first_rank_first(
    local_rank: int, local_world_size: int, output_dir: str | Path, description: str
) -> Iterator[None]:
    """The machine's first rank runs the body first; the others run it once that one has, waiting
    on a file rather than in a collective."""
    if local_world_size <= 1:
        yield
        return
    marker = ready_marker(output_dir, description)
    if local_rank == 0:
        remove_markers_of_ended_launches(output_dir)
        yield
        marker.parent.mkdir(parents=True, exist_ok=True)
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
