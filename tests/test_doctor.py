"""`finetune doctor` checks the machine on the ranks a run would start and says what to do, in one
table; `finetune run --doctor` trains only when every check passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL

pytestmark = pytest.mark.integration

PLACEMENT = ["--profile", "ddp", "--num_processes", "2"]


def finetune(*arguments: str, environment=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "finetune", *arguments], cwd=PROJECT_ROOT,
                          env=environment or ENVIRONMENT, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S)  # fmt: skip


def rows(output_dir) -> dict[tuple[int, str], dict]:
    return {(row["rank"], row["name"]): row for row in json.loads((output_dir / "doctor.json").read_text())}


@pytest.fixture(scope="module")
def run_with_doctor(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`finetune run --doctor` on 2 ranks with a global batch to resolve: its result and output folder,
    read by the tests below (each launch costs more than their checks)."""
    output_dir = tmp_path_factory.mktemp("doctor") / "out"
    flags = [*TINY_MODEL, "--max_steps", "2", "--block_size", "32", "--max_eval_samples", "4"]
    result = finetune("run", *PLACEMENT, "--doctor", *flags, "--global_batch_size", "12",
                      "--output_dir", str(output_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result, output_dir


def test_run_with_doctor_checks_two_ranks_then_trains_and_records_it(run_with_doctor):
    result, output_dir = run_with_doctor
    summary = json.loads((output_dir / "run_summary.json").read_text())
    assert (summary["status"], summary["doctor"]) == ("completed", "passed")
    found = rows(output_dir)
    assert all(row["passed"] for row in found.values())
    for rank in (0, 1):
        assert found[(rank, "all-reduce 16 MiB")]["measured"].endswith("GB/s bus bandwidth")
        assert found[(rank, "first collective")]["passed"]
    assert "| 1 | all-gather 1 MiB |" in result.stdout


def test_doctor_checks_the_run_the_flags_start_its_batch_and_precision_as_the_run_resolves_them(
    run_with_doctor,
):
    """--global_batch_size chooses the micro batch and --precision auto the dtype once the launch is
    known: doctor resolves them as the run does, and says which run it checked."""
    _, output_dir = run_with_doctor
    summary = json.loads((output_dir / "run_summary.json").read_text())
    geometry = (
        summary["micro_batch_size"],
        summary["gradient_accumulation_steps"],
        summary["global_batch_size"],
    )
    assert geometry == (6, 1, 12)
    checked = rows(output_dir)[(0, "run checked")]["measured"]
    assert checked == f"ddp on 2 process(es), micro batch 6 x 1 (global 12), {summary['dtype']}, eager"


def test_a_missing_dataset_a_stale_lock_and_a_full_disk_each_fail_with_what_to_do(tmp_path):
    lock = tmp_path / "extensions" / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    environment = {**ENVIRONMENT, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    result = finetune(
        "doctor", *PLACEMENT, *TINY_MODEL, "--dataset", "no-such-dataset", "--save_total_limit", "1000000000",
        "--output_dir", str(tmp_path / "out"), environment=environment,
    )  # fmt: skip
    assert result.returncode == 4
    found = rows(tmp_path / "out")
    failed = sorted({name for (_, name), row in found.items() if not row["passed"]})
    assert failed == ["dataset found", "disk", "op build locks"]
    assert found[(0, "op build locks")]["advice"] == f"rm {lock}"
    assert "not found" in found[(0, "dataset found")]["advice"]
    assert "failed: " in result.stderr.splitlines()[-1]


def test_run_with_doctor_does_not_train_when_a_check_fails(tmp_path):
    output_dir = tmp_path / "out"
    result = finetune("run", *PLACEMENT, "--doctor", *TINY_MODEL, "--dataset", "no-such-dataset",
                      "--output_dir", str(output_dir))  # fmt: skip
    assert result.returncode == 4
    assert "no run started" in result.stderr
    assert not (output_dir / "run_summary.json").exists()


def test_an_offload_profile_has_its_deepspeed_ops_built_and_host_ram_checked(tmp_path):
    result = finetune("doctor", "--profile", "zero2_offload", "--num_processes", "2", *TINY_MODEL,
                      "--output_dir", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = rows(tmp_path / "out")
    assert found[(0, "DeepSpeed op CPUAdamBuilder")]["measured"].startswith("ready in ")
    assert found[(0, "DeepSpeed op ShareMemCommBuilder")]["passed"]
    assert found[(0, "host RAM (offload)")]["passed"]
    assert (1, "host RAM (offload)") not in found  # once per machine, by its first rank
