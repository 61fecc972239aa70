"""A process named across time: host, pid and start time, so that a record left on disk (an
output_dir's lock, a launch's ready marker) can tell whether the process that wrote it still runs.

A pid alone does not: a killed process's pid is handed to a later one (in a container, each job's
processes get the same small pids), and a record trusted by pid would be taken as live forever.
"""

from __future__ import annotations

import socket

import psutil


def process_is_gone(host: str, pid: int, process_started: float) -> bool:
    """True only when this host can tell: the pid is free, or now belongs to a process started at
    another time (a recycled pid). Another host's process, or one this user may not inspect, is
    taken as running: a record is never cleared on a guess."""
    if host != socket.gethostname():
        return False
    try:
        return psutil.Process(pid).create_time() != process_started
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False
