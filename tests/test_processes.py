"""A record on disk names its process by host, pid and start: gone only when this host can tell."""

import os
import socket
import subprocess
import sys

import psutil

from finetune.processes import process_is_gone


def started(pid: int) -> float:
    return psutil.Process(pid).create_time()


def test_a_running_process_is_not_gone():
    assert not process_is_gone(socket.gethostname(), os.getpid(), started(os.getpid()))


def test_an_ended_process_is_gone():
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    when = started(ended.pid)
    ended.wait()
    assert process_is_gone(socket.gethostname(), ended.pid, when)


def test_a_pid_now_held_by_a_process_started_at_another_time_is_gone():
    assert process_is_gone(socket.gethostname(), os.getpid(), started(os.getpid()) - 0.01)


def test_another_hosts_process_is_never_taken_as_gone():
    assert not process_is_gone("another-machine", 2**22 + 1, 0.0)


def test_a_process_this_user_may_not_inspect_is_taken_as_running(monkeypatch):
    def denied(pid):
        raise psutil.AccessDenied(pid)

    monkeypatch.setattr(psutil, "Process", denied)
    assert not process_is_gone(socket.gethostname(), 1, 0.0)
