"""A full disk is one line and a resumable run: checked before each save, the partial copy removed on
ENOSPC, the summary written, and `--resume` continuing from the last complete checkpoint."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from finetune import disk_space, run
from finetune.checkpoint import checkpoints_newest_first
from finetune.summary import read_summary, write_summary

from launching import TINY_MODEL

FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "32", "--batch_size", "2",
    "--max_steps", "4", "--save_steps", "2", "--logging_steps", "1", "--max_eval_samples", "4",
    "--report_to", "none", "--disable_tqdm", "true",
]  # fmt: skip
Usage = namedtuple("Usage", "total used free")


def one_line_failure(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        run.main(argv)
    assert stopped.value.code == 2
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("finetune: error:")]
    return line


def fill_the_disk_after_the_first_checkpoint(monkeypatch, output_dir: Path) -> None:
    """Free space reported as plenty until a checkpoint exists, then as 1 kB."""
    real = shutil.disk_usage

    def usage(path):
        free = 1024 if checkpoints_newest_first(output_dir) else real(path).free
        return Usage(real(path).total, real(path).used, free)

    monkeypatch.setattr(disk_space.shutil, "disk_usage", usage)


def test_a_save_that_would_not_fit_stops_in_one_line_keeping_the_last_checkpoint(
    tmp_path, monkeypatch, capsys, in_process_commands
):
    output_dir = tmp_path / "out"
    fill_the_disk_after_the_first_checkpoint(monkeypatch, output_dir)
    line = one_line_failure([*FLAGS, "--output_dir", str(output_dir)], capsys)
    assert f"not enough disk space for checkpoint-4 in {output_dir}" in line
    assert "the last complete checkpoint is checkpoint-2" in line
    summary = read_summary(output_dir)
    assert summary["status"] == "failed" and str(output_dir) in summary["error"]
    assert [path.name for path in checkpoints_newest_first(output_dir)] == ["checkpoint-2"]
    assert not (output_dir / ".staging").exists()


# what torch.save raises on a full disk: its C++ writer's RuntimeError, or an OSError from Python's side
FULL_DISK_ERRORS = {
    "OSError": lambda f: OSError(errno.ENOSPC, "No space left on device", str(f)),
    "torch.save's RuntimeError": lambda f: RuntimeError(
        "[enforce fail at inline_container.cc:664] . unexpected pos 4096 vs 3968"
    ),
    "safetensors' SafetensorError": lambda f: SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    ),
}


@pytest.mark.parametrize("raised", sorted(FULL_DISK_ERRORS))
def test_disk_full_during_a_save_removes_the_partial_copy_and_resume_continues(
    tmp_path, monkeypatch, capsys, in_process_commands, raised
):
    output_dir = tmp_path / "out"
    real_save, real_usage = torch.save, shutil.disk_usage
    full = []

    def save_until_full(obj, f, *args, **kwargs):
        if "checkpoint-4" in str(f):
            Path(f).write_bytes(b"partial")
            full.append(True)
            raise FULL_DISK_ERRORS[raised](f)
        return real_save(obj, f, *args, **kwargs)

    def usage(path):  # plenty before the save (its check passes), nothing left once it filled the disk
        return Usage(real_usage(path).total, real_usage(path).used, 0 if full else real_usage(path).free)

    monkeypatch.setattr(torch, "save", save_until_full)
    monkeypatch.setattr(disk_space.shutil, "disk_usage", usage)
    line = one_line_failure([*FLAGS, "--output_dir", str(output_dir)], capsys)
    assert "disk full while writing checkpoint-4" in line and "checkpoint-2" in line
    assert read_summary(output_dir)["status"] == "failed"
    assert not (output_dir / ".staging").exists()

    monkeypatch.setattr(torch, "save", real_save)
    full.clear()
    run.main([*FLAGS, "--output_dir", str(output_dir), "--resume"])
    assert f"finetune: resuming from {output_dir / 'checkpoint-2'} (step 2)" in capsys.readouterr().out
    summary = read_summary(output_dir)
    assert (summary["status"], summary["resumed_from_step"], summary["steps"]) == ("completed", 2, 4)


def test_disk_full_in_the_final_save_leaves_no_partial_file_in_the_run_folder(
    tmp_path, monkeypatch, capsys, in_process_commands
):
    """The model fits, the tokenizer does not (as on a small tmpfs): without staging, a truncated
    tokenizer.json stayed in the run folder. tokenizers' Rust writer names the OS error number."""
    output_dir = tmp_path / "out"

    def save_until_full(self, save_directory, *args, **kwargs):
        (Path(save_directory) / "tokenizer.json").write_text("{")
        raise Exception("No space left on device (os error 28)")

    monkeypatch.setattr(TokenizersBackend, "save_pretrained", save_until_full)
    line = one_line_failure([*FLAGS, "--output_dir", str(output_dir), "--save_strategy", "no"], capsys)
    assert f"disk full while writing the trained model into {output_dir}" in line
    assert read_summary(output_dir)["status"] == "failed"
    left = {path.name for path in output_dir.iterdir()}
    assert not left & {"tokenizer.json", "model.safetensors", "config.json", ".staging"}, left


def test_a_summary_that_cannot_be_written_leaves_no_partial_file(tmp_path, monkeypatch):
    write_summary(tmp_path, {"status": "running"})
    real_write_text = Path.write_text

    def write_until_full(self, text, *args, **kwargs):
        real_write_text(self, text[:5])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", write_until_full)
    with pytest.raises(OSError):
        write_summary(tmp_path, {"status": "completed"})
    monkeypatch.undo()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run_summary.json"]
    assert read_summary(tmp_path) == {"status": "running"}


def test_the_start_warns_when_the_kept_checkpoints_cannot_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 10 * 2**20)
    model = torch.nn.Linear(1000, 1000)  # 4 MB of weights, 8 MB of Adam states: 12 MB a checkpoint
    assert "1 checkpoints of about 0.01 GiB" in disk_space.kept_checkpoints_problem(tmp_path, model, None)
    assert "3 checkpoints of about 0.01 GiB" in disk_space.kept_checkpoints_problem(tmp_path, model, 2)


def test_no_warning_when_they_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 40 * 2**20)
    assert disk_space.kept_checkpoints_problem(tmp_path, torch.nn.Linear(1000, 1000), 2) is None


def test_the_expected_size_is_the_newest_checkpoints(tmp_path):
    from finetune.checkpoint import write_manifest

    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"x" * 1000)
    write_manifest(checkpoint, 3, "run")
    assert disk_space.expected_checkpoint_bytes(tmp_path, torch.nn.Linear(1000, 1000)) == 1000


def test_a_save_into_an_output_folder_not_made_yet_counts_the_disk_it_will_be_on(tmp_path):
    """A run stopped before it saved anything has no output folder yet; its stop-time save must
    still be checked, not fail on the missing folder."""
    not_made = tmp_path / "runs" / "first"
    assert disk_space.room_problem(not_made, torch.nn.Linear(10, 10), step=3) is None
