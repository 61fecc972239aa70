"""Slow work on rank 0 does not time the others out: they wait for dataset preparation on a file,
not in a collective, and a save raises the collective timeout for its size."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest

from finetune.slow_work import ready_marker, remove_markers_of_ended_launches, save_timeout
from finetune.summary import read_summary

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL

COLLECTIVE_TIMEOUT_S = 5
SLOW_S = 15
FLAGS = [
    *TINY_MODEL, "--block_size", "32", "--batch_size", "2", "--max_steps", "2", "--max_eval_samples", "4",
    "--save_strategy", "no", "--report_to", "none", "--ddp_timeout", str(COLLECTIVE_TIMEOUT_S),
]  # fmt: skip


def slow_run(phase: str, output_dir) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "finetune.launch", "--config_file", "accelerate_configs/ddp.yaml",
               "--num_processes", "2", "--main_process_port", "0", "tests/slow_rank_zero_run.py",
               *FLAGS, "--output_dir", str(output_dir)]  # fmt: skip
    environment = {**ENVIRONMENT, "SLOW_PHASE": phase, "SLOW_S": str(SLOW_S)}
    return subprocess.run(command, cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S)  # fmt: skip


@pytest.mark.integration
def test_dataset_preparation_longer_than_the_collective_timeout_completes(tmp_path):
    result = slow_run("data", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "out")["status"] == "completed"


@pytest.mark.integration
def test_a_save_longer_than_the_collective_timeout_completes(tmp_path):
    result = slow_run("save", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "out")["status"] == "completed"


def test_a_save_gets_the_run_timeout_plus_what_the_slowest_disk_needs_for_its_size():
    assert save_timeout(int(50e9), 1800).total_seconds() == 1800 + 1000


def start_of(pid: int, earlier_by_s: float = 0.0) -> str:
    """A process's start as a marker's name writes it (repr of psutil's create_time)."""
    return repr(psutil.Process(pid).create_time() - earlier_by_s)


def marker_of(output_dir, pid: int, started: str, host: str = socket.gethostname()):
    return output_dir / ".launch" / f"ready-dataset-preparation-{pid}-{started}@{host}"


def test_the_marker_lies_in_the_runs_own_folder_not_in_one_every_user_shares(tmp_path):
    assert ready_marker(tmp_path, "dataset preparation").parent == tmp_path / ".launch"


def test_an_earlier_launcher_of_the_same_pid_had_another_marker(tmp_path, monkeypatch):
    this_launch = ready_marker(tmp_path, "dataset preparation")
    started = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda process: started(process) - 60)
    assert ready_marker(tmp_path, "dataset preparation") != this_launch


def test_markers_of_ended_launches_on_this_machine_are_removed_and_the_rest_kept(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()
    running = os.getpid()
    markers = {
        "ended": marker_of(tmp_path, ended.pid, start_of(running)),
        "pid reused": marker_of(tmp_path, running, start_of(running, earlier_by_s=0.01)),
        "running": marker_of(tmp_path, running, start_of(running)),
        "another machine's": marker_of(tmp_path, ended.pid, "1.0", host="another-machine"),
    }
    for path in markers.values():
        path.parent.mkdir(exist_ok=True)
        path.touch()
    remove_markers_of_ended_launches(tmp_path)
    assert {name for name, path in markers.items() if path.exists()} == {"running", "another machine's"}


def test_this_launchs_own_marker_survives_the_sweep(tmp_path):
    marker = ready_marker(tmp_path, "dataset preparation")
    marker.parent.mkdir()
    marker.touch()
    remove_markers_of_ended_launches(tmp_path)
    assert marker.exists()
