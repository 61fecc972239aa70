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

from finetune.processes import process_is_gone
from finetune.run_folder import READY_MARKER, ready_marker_folder

POLL_S = 0.5
SLOWEST_DISK_BYTES_PER_S = 50e6  # the slowest disk a save should survive: a network file system under load


def ready_marker(output_dir: str | Path, description: str) -> Path:
    """This launch's marker on this machine (a shared output_dir holds every machine's), named by the
    launcher every rank of a machine shares as parent (torch's elastic agent): its pid and its start
    time, which tells a recycled pid apart. A launch killed outright leaves its marker behind, and a
    later launcher given the same pid (a container starts each job's processes alike) must not take
    that marker as its own."""
    launcher = psutil.Process(os.getppid())
    name = READY_MARKER.format(
        what=description.replace(" ", "-"),
        pid=launcher.pid,
        started=repr(launcher.create_time()),  # repr: the float back exactly when read
        host=socket.gethostname(),
    )
    return ready_marker_folder(output_dir) / name


def remove_markers_of_ended_launches(output_dir: str | Path) -> None:
    """Markers whose launcher has ended (`processes.process_is_gone`, as for the folder's lock): those
    of launches killed before they could clean up. Another machine's are that machine's to judge."""
    for path in ready_marker_folder(output_dir).glob(
        READY_MARKER.format(what="*", pid="*", started="*", host="*")
    ):
        launch, host = path.name.rsplit("@", 1)
        pid, started = launch.rsplit("-", 2)[1:]
        with suppress(ValueError):  # a name this module did not write
            if process_is_gone(host, int(pid), float(started)):
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
