"""finetune compare: which profiles it runs and how it names them; for real, 2-process CPU runs of several
profiles, one of them failing."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import finetune.compare
from finetune.calibration import measured_calibration
from finetune.cli import main as cli_main
from finetune.compare import Row, compare, default_profiles, read_rows, summaries_frame
from finetune.launch import Placement
from finetune.layout import ParallelLayout
from finetune.memory_model import estimate
from finetune.model_shapes import shape_of
from finetune.pictures import comparison_picture
from finetune.profiles import load_profile, load_strategy
from finetune.summary import write_summary
from finetune.workload import Workload

from launching import BYTE_GPT2, ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL

RUN_FLAGS = [
    *TINY_MODEL[2:], "--dataset", "wikitext-2-raw-v1", "--block_size", "64", "--max_steps", "6",
    "--batch_size", "4", "--max_eval_samples", "8", "--throughput_warmup_steps", "1",
    "--logging_steps", "2", "--disable_tqdm", "true",
]  # fmt: skip
PROFILES = ["ddp", "zero3_nvme"]  # zero3_nvme fails: no --nvme_path
COMPARE = [sys.executable, "-m", "finetune", "compare", "--model", str(BYTE_GPT2), "--num_processes", "2"]
KEPT_COMPARISON = PROJECT_ROOT / "notebooks" / "data" / "compare-cpu"  # written before runs had own folders


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


@pytest.mark.integration
def test_every_profile_has_a_row_in_order(comparison):
    assert list(rows(comparison)) == PROFILES


@pytest.mark.integration
def test_profiles_that_ran_have_their_measurements(comparison):
    for profile in ("ddp",):
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
        assert float(row["planned_peak_gib"]) > 0  # what finetune plan predicts per GPU for this run


@pytest.mark.integration
def test_a_failed_profile_is_a_row_with_its_reason(comparison):
    row = rows(comparison)["zero3_nvme"]
    assert row["status"] == "failed"
    assert "--nvme_path" in row["reason"]


@pytest.mark.integration
def test_a_failed_runs_reason_is_our_line_without_the_progress_bar_cut_short_before_it(tmp_path):
    log = tmp_path / "launch.log"
    log.write_text(
        "step 1\n  0%|          | 0/1 [00:00<?, ?it/s]finetune: rank 0 stopped with exit code 137\n"
    )
    assert finetune.compare.failure_reason(log) == "finetune: rank 0 stopped with exit code 137"


def test_markdown_table_and_picture_are_written(comparison):
    markdown = (comparison / "comparison.md").read_text()
    assert "| ddp | completed | full | 2 |" in markdown
    assert "| zero3_nvme | failed |" in markdown
    assert "2 x cpu; torch" in markdown
    assert (comparison / "comparison.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.integration
def test_tensorboard_logs_of_every_run_are_under_one_root(comparison):
    runs = {path.parent.parent.parent.name for path in comparison.glob("*/runs/*/events.out.tfevents.*")}
    assert runs == {rows(comparison)[profile]["run_dir"] for profile in ("ddp",)}


@pytest.mark.integration
def test_each_run_has_a_folder_of_its_own_named_by_profile_and_time(comparison):
    for profile, row in rows(comparison).items():
        assert row["run_dir"].startswith(f"{profile}-{row['started_at'][:4]}")
        assert (comparison / row["run_dir"] / "launch.log").exists()


def run_compare(output_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [*COMPARE, "--output_dir", str(output_dir), *flags, *RUN_FLAGS]
    return subprocess.run(
        command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )


@pytest.mark.integration
def test_a_second_comparison_into_the_folder_keeps_the_earlier_rows_and_runs(tmp_path):
    run_compare(tmp_path, "--profiles", "zero3_nvme")  # fails fast: no --nvme_path
    (first,) = rows_in_order(tmp_path)
    first_log = (tmp_path / first["run_dir"] / "launch.log").read_bytes()
    run_compare(tmp_path, "--profiles", "zero3_nvme")
    earlier, later = rows_in_order(tmp_path)
    assert earlier == first
    assert later["run_dir"] != first["run_dir"] and later["started_at"] > first["started_at"]
    assert (tmp_path / first["run_dir"] / "launch.log").read_bytes() == first_log
    assert (tmp_path / "comparison.md").read_text().count("| zero3_nvme | failed |") == 2


def rows_in_order(output_dir):
    with (output_dir / "comparison.csv").open() as stream:
        return list(csv.DictReader(stream))


def test_rows_of_a_comparison_from_before_runs_had_own_folders_are_read_back(tmp_path):
    shutil.copytree(KEPT_COMPARISON, tmp_path, dirs_exist_ok=True)
    earlier = read_rows(tmp_path)
    assert [row.profile for row in earlier] == ["ddp", "fsdp", "zero2", "zero3"]
    assert earlier[0].run_dir == "ddp" and earlier[0].world_size == 2 and earlier[0].compiled is None
    assert earlier[0].peak_memory_gib == pytest.approx(0.7675819396972656)


def test_summaries_frame_has_one_row_per_run_with_its_folder(tmp_path):
    shutil.copytree(KEPT_COMPARISON, tmp_path, dirs_exist_ok=True)
    shutil.copytree(tmp_path / "ddp", tmp_path / "ddp-20260101-120000")
    frame = summaries_frame(tmp_path)
    assert list(frame.profile) == ["ddp", "ddp", "fsdp", "zero2", "zero3"]
    assert list(frame.run_dir) == ["ddp", "ddp-20260101-120000", "fsdp", "zero2", "zero3"]


@pytest.mark.integration
def test_a_run_past_its_time_limit_is_stopped_and_reported(tmp_path):
    command = [*COMPARE, "--profiles", "ddp", "--output_dir", str(tmp_path), "--timeout", "3", *RUN_FLAGS,
               "--max_steps", "100000"]  # fmt: skip
    result = subprocess.run(
        command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert result.returncode == 1  # no profile completed
    row = rows(tmp_path)["ddp"]
    assert (row["status"], row["reason"]) == ("timeout", "stopped after 3 s")


@pytest.mark.integration
def test_the_markdown_table_says_whether_each_profile_was_compiled(comparison):
    table = (comparison / "comparison.md").read_text()
    assert "| compiled |" in table
    assert "| ddp | completed | full | 2 | no |" in table


def test_by_default_every_multi_process_profile_is_compared_fastest_first():
    assert default_profiles([]) == [
        "ddp", "zero1", "zero2", "fsdp_grad_op", "fsdp", "zero3", "zero2_offload", "zero3_offload",
    ]  # fmt: skip
    assert default_profiles(["--nvme_path", "nvme"])[-1] == "zero3_nvme"


def test_with_a_sequence_degree_the_profiles_that_split_sequences_are_compared():
    assert default_profiles(["--sequence_parallel", "2"], sequence_parallel=2) == [
        "fsdp_grad_op", "fsdp", "zero3", "zero3_offload",
    ]  # fmt: skip


def test_without_gpus_a_sequence_degree_compares_the_ulysses_profiles_only():
    """The FSDP profiles' ring attention runs on CUDA only: they would fail every run on CPU."""
    flags = ["--sequence_parallel", "2"]
    assert default_profiles(flags, sequence_parallel=2, on_gpu=False) == ["zero3", "zero3_offload"]


def test_a_copied_profile_is_compared_beside_a_shipped_name_under_its_file_name(
    tmp_path, monkeypatch, capsys
):
    assert cli_main(["profiles", "--copy", "zero3", str(tmp_path / "mine")]) == 0
    copy = (tmp_path / "mine" / "zero3.yaml").rename(tmp_path / "mine" / "my_zero3.yaml")
    ran = []

    def run_profile(name, placement, run_args, run_dir, timeout_s, json_flags):
        ran.append((name, run_dir.name))
        return Row(load_profile(name).name, "completed")

    monkeypatch.setattr(finetune.compare, "run_profile", run_profile)
    rows = compare(["ddp", str(copy)], Placement(2), [], tmp_path / "out", 60, "finetune compare")
    assert [row.profile for row in rows] == ["ddp", "my_zero3"]
    assert ran[1][0] == str(copy) and ran[1][1].startswith("my_zero3-")
    assert "| my_zero3 | completed |" in (tmp_path / "out" / "comparison.md").read_text()


def test_a_profile_whose_json_overrides_the_optim_flag_fails_its_row_without_launching(
    tmp_path, monkeypatch, capsys
):
    def launched(*args, **kwargs):
        raise AssertionError("a profile `finetune run` would refuse was launched")

    monkeypatch.setattr(finetune.compare.subprocess, "Popen", launched)
    output_dir = tmp_path / "out"
    argv = ["compare", "--profiles", "zero2_offload", "--output_dir", str(output_dir),
            "--model", str(BYTE_GPT2), "--optim", "sgd"]  # fmt: skip
    assert cli_main(argv) == 1
    (row,) = read_rows(output_dir)
    assert row.status == "failed"
    assert "--optim sgd: " in row.reason and "zero2_offload.json sets DeepSpeed's own optimizer" in row.reason


def measured(profile: str, training: str, memory: float, speed: float) -> Row:
    return Row(profile, "completed", training=training, world_size=2, memory_kind="allocated",
               peak_memory_gib=memory, tokens_per_second_per_device=speed)  # fmt: skip


def variant_rows() -> list[Row]:
    """ddp and zero3, full and LoRA each, in the order they ran (zero3's full run last), and a LoRA
    run that ran out of memory."""
    return [
        measured("ddp", "full", 16.0, 100_000.0),
        measured("ddp", "lora", 12.0, 101_000.0),
        measured("zero3", "lora", 22.0, 17_000.0),
        Row("fsdp", "failed", reason="out of memory", training="lora"),
        measured("zero3", "full", 11.0, 47_000.0),
    ]


def test_the_picture_draws_one_labelled_bar_per_profile_and_variant_as_the_csv_says(tmp_path):
    rows = variant_rows()
    finetune.compare.write_csv(rows, tmp_path / "comparison.csv")
    drawn = comparison_picture(read_rows(tmp_path), {}, tmp_path / "comparison.png")["bars"]
    assert [label for label, _, _ in drawn] == [
        "ddp (full)", "ddp (lora)", "zero3 (lora)", "zero3 (full)", "fsdp (lora)",
    ]  # fmt: skip
    by_label = {f"{row.profile} ({row.training})": row for row in read_rows(tmp_path)}
    for label, memory, speed in drawn:
        row = by_label[label]
        assert (memory, speed) == (row.peak_memory_gib or 0, row.tokens_per_second_per_device or 0)
    assert (tmp_path / "comparison.png").read_bytes().startswith(b"\x89PNG")


def test_the_picture_marks_the_planned_peak_beside_each_measured_gpu_peak(tmp_path):
    """The planner's GiB per GPU is marked on a GPU row's memory bar; a host-memory row (CPU runs)
    has no mark, its measured number not being what the planner predicts."""
    gpu = [measured("ddp", "", 16.0, 100_000.0), measured("zero3", "", 11.0, 47_000.0)]
    gpu[0].planned_peak_gib, gpu[1].planned_peak_gib = 15.2, 12.5
    host = Row(
        "fsdp", "completed", world_size=2, memory_kind="host RSS", peak_memory_gib=3.0, planned_peak_gib=9.0
    )
    drawn = comparison_picture([*gpu, host], {}, tmp_path / "comparison.png")
    assert drawn["planned"] == [("ddp", 15.2), ("zero3", 12.5)]


def test_a_completed_runs_row_has_the_planners_prediction_for_that_run():
    summary = {
        "model": "gpt2-medium", "block_size": 1024, "micro_batch_size": 8, "dtype": "bf16",
        "gradient_accumulation_steps": 2, "gradient_checkpointing": False, "torch_compile": True,
        "peft": None, "world_size": 4, "arguments": {"config_overrides": None},
    }  # fmt: skip
    ddp = load_strategy("ddp")
    planned = finetune.compare.planned_peak_gib(ddp, summary)
    workload = Workload(8, 1024, "bf16", gradient_checkpointing=False, compiled=True, accumulation=2)
    expected = estimate(ddp, shape_of("gpt2-medium")[0], workload, ParallelLayout(4), measured_calibration())
    assert planned == pytest.approx(expected.total)


def test_a_runs_predicted_peak_counts_its_fsdp_units_and_prefetch():
    summary = {
        "model": "gpt2-xl", "block_size": 1024, "micro_batch_size": 1, "dtype": "bf16",
        "gradient_accumulation_steps": 1, "gradient_checkpointing": True, "torch_compile": True,
        "peft": None, "world_size": 4,
        "arguments": {"config_overrides": None, "fsdp_blocks_per_unit": 12, "fsdp_prefetch": 3},
    }  # fmt: skip
    fsdp, shape, calibration = load_strategy("fsdp"), shape_of("gpt2-xl")[0], measured_calibration()
    workload = Workload(
        1, 1024, gradient_checkpointing=True, compiled=True, fsdp_blocks_per_unit=12, fsdp_prefetch=3
    )
    expected = estimate(fsdp, shape, workload, ParallelLayout(4), calibration).total
    assert finetune.compare.planned_peak_gib(fsdp, summary) == pytest.approx(expected)
    default = replace(workload, fsdp_blocks_per_unit=Workload.fsdp_blocks_per_unit, fsdp_prefetch=0)
    assert expected > estimate(fsdp, shape, default, ParallelLayout(4), calibration).total


def test_the_picture_overlays_each_runs_logged_training_loss_by_step(tmp_path):
    rows = [measured("ddp", "", 16.0, 100_000.0), measured("zero3", "", 11.0, 47_000.0)]
    curves = {"ddp": [(10, 4.0), (20, 3.0)], "zero3": [(10, 4.1), (20, 2.9)]}
    for row in rows:
        row.run_dir = f"{row.profile}-run"
        logged = [{"step": step, "loss": loss} for step, loss in curves[row.profile]]
        write_summary(tmp_path / row.run_dir, {"loss_curve": logged})
    drawn = comparison_picture(
        rows, finetune.compare.loss_curves(rows, tmp_path), tmp_path / "comparison.png"
    )
    assert drawn["curves"] == curves


def test_each_runs_new_console_line_is_shown_while_it_runs(tmp_path, capsys, monkeypatch):
    """A run that logs twice, then ends: each step line once, prefixed by its profile."""
    monkeypatch.setattr(finetune.compare, "PROGRESS_POLL_S", 0.05)
    log = tmp_path / "launch.log"
    script = (
        "import time, sys\n"
        f"log = open({str(log)!r}, 'a')\n"
        "for step in (10, 20):\n"
        "    log.write(f'step {step}/20 | loss 5.0\\n'); log.flush(); time.sleep(0.5)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script])
    finetune.compare.wait_showing_progress(process, log, "ddp", timeout_s=60)
    shown = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune compare:")]
    assert shown == [
        "finetune compare: ddp: step 10/20 | loss 5.0",
        "finetune compare: ddp: step 20/20 | loss 5.0",
    ]
