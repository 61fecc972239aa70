"""finetune compare, for real: 2-process CPU runs of several profiles, one of them failing."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL

pytestmark = pytest.mark.integration

RUN_FLAGS = [
    *TINY_MODEL[2:], "--dataset", "wikitext-2-raw-v1", "--block_size", "64", "--max_steps", "6",
    "--batch_size", "4", "--max_eval_samples", "8", "--throughput_warmup_steps", "1",
    "--logging_steps", "2", "--disable_tqdm", "true",
]  # fmt: skip
PROFILES = ["ddp", "fsdp", "zero2", "zero3_nvme"]  # zero3_nvme fails: no --nvme_path
COMPARE = [sys.executable, "-m", "finetune", "compare", "--model", "gpt2", "--num_processes", "2"]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("compare")
    command = [*COMPARE, "--profiles", ",".join(PROFILES), "--output_dir", str(output_dir), *RUN_FLAGS]
    result = subprocess.run(
        command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return output_dir


def rows(output_dir):
    with (output_dir / "comparison.csv").open() as stream:
        return {row["profile"]: row for row in csv.DictReader(stream)}


def test_every_profile_has_a_row_in_order(comparison):
    assert list(rows(comparison)) == PROFILES


def test_profiles_that_ran_have_their_measurements(comparison):
    for profile in ("ddp", "fsdp", "zero2"):
        row = rows(comparison)[profile]
        assert row["status"] == "completed"
        assert row["world_size"] == "2"
        assert row["compiled"] == "False"  # CPU runs are not compiled by default
        assert row["memory_kind"] == "host RSS"
        assert float(row["peak_memory_gib"]) > 0
        assert float(row["tokens_per_second_per_device"]) == pytest.approx(
            float(row["tokens_per_second"]) / 2
        )
        assert float(row["eval_perplexity"]) > 1


def test_a_failed_profile_is_a_row_with_its_reason(comparison):
    row = rows(comparison)["zero3_nvme"]
    assert row["status"] == "failed"
    assert "--nvme_path" in row["reason"]


def test_markdown_table_and_picture_are_written(comparison):
    markdown = (comparison / "comparison.md").read_text()
    assert "| ddp | completed | 2 |" in markdown
    assert "| zero3_nvme | failed |" in markdown
    assert "2 x cpu; torch" in markdown
    assert (comparison / "comparison.png").read_bytes().startswith(b"\x89PNG")


def test_tensorboard_logs_of_every_run_are_under_one_root(comparison):
    runs = sorted(
        path.parent.parent.parent.name for path in comparison.glob("*/runs/*/events.out.tfevents.*")
    )
    assert sorted(set(runs)) == ["ddp", "fsdp", "zero2"]


def test_a_run_past_its_time_limit_is_stopped_and_reported(tmp_path):
    command = [*COMPARE, "--profiles", "ddp", "--output_dir", str(tmp_path), "--timeout", "3", *RUN_FLAGS,
               "--max_steps", "100000"]  # fmt: skip
    result = subprocess.run(
        command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert result.returncode == 1  # no profile completed
    row = rows(tmp_path)["ddp"]
    assert (row["status"], row["reason"]) == ("timeout", "stopped after 3 s")


def test_the_markdown_table_says_whether_each_profile_was_compiled(comparison):
    table = (comparison / "comparison.md").read_text()
    assert "| compiled |" in table
    assert "| ddp | completed | 2 | no |" in table
