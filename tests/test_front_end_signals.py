"""A stop signal sent to `finetune run` alone (`kill PID`, not the process group) stops the run as one
sent to every rank does: each rank saves a checkpoint at the next step end, one line says so, the
command exits 75 (resumable), and no rank trains on after the front end is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from finetune.errors import INTERRUPTED_EXIT_CODE, RESUMABLE_EXIT_CODE
from finetune.run_folder import MANIFEST
from finetune.summary import read_summary

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL
from runs import finetune_run

pytestmark = pytest.mark.integration

FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "32", "--batch_size", "2",
    "--max_steps", "5000", "--save_steps", "5", "--logging_steps", "5", "--max_eval_samples", "4",
    "--report_to", "none", "--disable_tqdm", "true",
]  # fmt: skip


def start_and_wait_for_a_checkpoint(command: list[str], output_dir: Path) -> subprocess.Popen:
    front_end = subprocess.Popen(
        [*command, *FLAGS, "--output_dir", str(output_dir)], cwd=PROJECT_ROOT, env=ENVIRONMENT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (output_dir / "checkpoint-5" / MANIFEST).exists():
        assert front_end.poll() is None, front_end.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return front_end


@pytest.mark.parametrize("profile", ["ddp", "single"])
def test_sigterm_to_the_front_end_alone_saves_on_every_rank_and_exits_resumable(tmp_path, profile):
    output_dir = tmp_path / "out"
    command = finetune_run(profile) if profile != "single" else finetune_run(profile)[:-2]
    front_end = start_and_wait_for_a_checkpoint(command, output_dir)
    descendants = psutil.Process(front_end.pid).children(recursive=True)
    front_end.send_signal(signal.SIGTERM)
    _, stderr = front_end.communicate(timeout=300)  # ranks training on would keep the pipes open
    assert front_end.returncode == RESUMABLE_EXIT_CODE, stderr[-3000:]
    stopped = read_summary(output_dir)
    assert stopped["status"] == "interrupted" and stopped["steps"] < 5000
    assert stopped["checkpoint"] == str(output_dir / f"checkpoint-{stopped['steps']}")
    assert len([line for line in stderr.splitlines() if "stopped by SIGTERM" in line]) == 1, stderr[-3000:]
    assert not [process for process in descendants if process.is_running() and process.status() != "zombie"]


def test_ctrl_c_in_the_terminal_of_a_two_rank_run_is_one_line_without_the_launchers_own(tmp_path):
    """Ctrl-C reaches the whole process group: the launcher and every rank."""
    output_dir = tmp_path / "out"
    front_end = subprocess.Popen(
        [*finetune_run("ddp"), *FLAGS, "--output_dir", str(output_dir)], cwd=PROJECT_ROOT, env=ENVIRONMENT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (output_dir / "checkpoint-5" / MANIFEST).exists():
        assert front_end.poll() is None and time.monotonic() < deadline, front_end.communicate()[1][-3000:]
        time.sleep(0.05)
    os.killpg(front_end.pid, signal.SIGINT)
    _, stderr = front_end.communicate(timeout=300)
    assert front_end.returncode == INTERRUPTED_EXIT_CODE, stderr[-3000:]
    assert "death signal" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("finetune: interrupted")]
    newest = read_summary(output_dir)["checkpoint"]
    continues = f"the run continues from {newest} with the same command and --resume"
    assert line == f"finetune: interrupted (SIGINT; {continues})"
