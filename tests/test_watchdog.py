"""A rank that stops inside a step ends the run in one line naming it and where it stopped, every
rank's stack on disk, exit 75 with a checkpoint to resume from."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from finetune.summary import read_summary
from finetune.watchdog import REPORTED

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL, accelerate_launch, launch

pytestmark = pytest.mark.integration

FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "32", "--batch_size", "2",
    "--max_steps", "6", "--save_steps", "2", "--logging_steps", "1", "--max_eval_samples", "4",
    "--report_to", "none", "--disable_tqdm", "true", "--watchdog_s", "5",
]  # fmt: skip


def test_a_stalled_rank_is_named_its_stacks_written_and_the_run_resumable(tmp_path):
    output_dir = tmp_path / "out"
    command = [sys.executable, "-m", "finetune.launch", "--config_file", "accelerate_configs/ddp.yaml",
               "--num_processes", "2", "--main_process_port", "0", "tests/stalled_run.py",
               *FLAGS, "--output_dir", str(output_dir)]  # fmt: skip
    result = subprocess.run(command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True,
                            timeout=LAUNCH_TIMEOUT_S)  # fmt: skip
    assert result.returncode == 75, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if "no optimizer step ended" in line]
    assert "at step 3: rank 1 at " in line and "stalled_run.py" in line and "in training_step" in line
    folder = output_dir / "hang-step3"
    assert f"stacks in {folder}" in line
    assert "stalled_run.py" in (folder / "rank1.txt").read_text()
    assert json.loads((folder / "rank0.json").read_text())["in_collective"] is True
    summary = read_summary(output_dir)
    assert (summary["status"], summary["hang"]) == ("interrupted", str(folder))
    assert summary["checkpoint"].endswith("checkpoint-2")
    launch(accelerate_launch("ddp"), output_dir, [*FLAGS, "--resume"])
    resumed = read_summary(output_dir)
    assert (resumed["status"], resumed["resumed_from_step"], resumed["steps"]) == ("completed", 2, 6)


def test_a_frozen_rank_0_is_reported_by_rank_1_in_one_line_with_the_summary(tmp_path):
    """Rank 0 stopped (SIGSTOP) writes nothing and reports nothing: rank 1 does, in its place."""
    output_dir = tmp_path / "out"
    command = [sys.executable, "-m", "finetune.launch", "--config_file", "accelerate_configs/ddp.yaml",
               "--num_processes", "2", "--main_process_port", "0", "tests/stalled_run.py",
               *FLAGS, "--output_dir", str(output_dir)]  # fmt: skip
    with (tmp_path / "stderr").open("w+") as stderr:
        launcher = subprocess.Popen(command, cwd=PROJECT_ROOT, env={**ENVIRONMENT, "FREEZE_RANK_0": "1"},
                                    stdout=subprocess.DEVNULL, stderr=stderr, text=True)  # fmt: skip
        try:
            # A stopped process acts on SIGKILL alone, which torch's launcher sends 30 s after rank 1
            # exits (its grace for ranks to stop by themselves): once the report is out, the test sends it.
            reported = output_dir / "hang-step3" / REPORTED
            deadline = time.monotonic() + LAUNCH_TIMEOUT_S
            while not reported.exists() and launcher.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if launcher.poll() is None:
                for rank in psutil.Process(launcher.pid).children():
                    if rank.status() == psutil.STATUS_STOPPED:
                        rank.kill()
            launcher.wait(timeout=LAUNCH_TIMEOUT_S)
        finally:
            launcher.kill()
        stderr.seek(0)
        output = stderr.read()
    assert launcher.returncode != 0
    [line] = [line for line in output.splitlines() if "no optimizer step ended" in line]
    assert "at step 3:" in line and "no stack from rank(s) 0" in line, line
    assert "Traceback" not in output, output[-3000:]
    summary = read_summary(output_dir)
    assert (summary["status"], summary["hang"]) == ("interrupted", str(output_dir / "hang-step3"))


def test_a_rank_reading_an_nccl_collectives_result_in_a_helper_counts_as_waiting():
    # under NCCL rank 0 of a stalled run was found here (benchmarks/h100x2-2026-11-26b), not in torch's code
    from finetune import checkpoint
    from finetune.watchdog import in_a_collective

    helper = f"{checkpoint.__file__}:232 in highest_on_any_rank"
    assert in_a_collective(["run.py:330 in main", helper])
    assert not in_a_collective(["run.py:330 in main", f"{checkpoint.__file__}:240 in on_step_end"])


def test_a_report_without_gathering_time_reads_the_files_there_once_and_names_the_ranks_missing(tmp_path):
    """The lowest other rank reports in rank 0's place after waiting for it: no second wait there."""
    import time

    from finetune.watchdog import Watchdog

    watchdog = Watchdog(5, str(tmp_path), rank=1, world_size=3, on_hang=lambda message, folder: None)
    for rank, frames in [(1, ["run.py:1 in main", "torch/distributed/c10d.py:9 in all_reduce"]),
                         (2, ["run.py:1 in main", "model.py:7 in forward"])]:  # fmt: skip
        record = {"rank": rank, "frames": frames, "in_collective": rank == 1}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(record))
    started = time.monotonic()
    line = watchdog.report(tmp_path, step=3, waited=6.0, gather_s=0.0)
    assert time.monotonic() - started < 1.0
    assert "rank 2 at model.py:7 in forward" in line and "no stack from rank(s) 0 " in line, line
