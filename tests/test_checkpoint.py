"""Checkpoints are complete or skipped; resume picks the newest good one; signals stop with a save."""

import hashlib
import json
import logging
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from finetune.checkpoint import (
    MANIFEST,
    STOP_SIGNALS,
    SaveAndStopOnSignal,
    checkpoint_problem,
    checkpoint_to_resume,
    latest_good_checkpoint,
    publish,
    write_manifest,
)
from finetune.errors import FinetuneError
from finetune.export import export_checkpoint


def make_checkpoint(root, step, files=None):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    state = json.dumps({"global_step": step}).encode()
    for name, content in (
        files or {"model.safetensors": b"weights" * 10, "trainer_state.json": state}
    ).items():
        (folder / name).write_bytes(content)
    write_manifest(folder, step, "run-a")
    return folder


def test_a_written_checkpoint_is_good(tmp_path):
    assert checkpoint_problem(make_checkpoint(tmp_path, 2)) is None


def test_manifest_records_step_run_name_and_each_files_size_and_sha256(tmp_path):
    manifest = json.loads((make_checkpoint(tmp_path, 2) / MANIFEST).read_text())
    assert (manifest["step"], manifest["run_name"]) == (2, "run-a")
    assert manifest["files"] == {
        "model.safetensors": {"size": 70, "sha256": hashlib.sha256(b"weights" * 10).hexdigest()},
        "trainer_state.json": {"size": 18, "sha256": hashlib.sha256(b'{"global_step": 2}').hexdigest()},
    }


def test_bytes_damaged_with_the_size_kept_are_a_problem(tmp_path):
    folder = make_checkpoint(tmp_path, 2)
    (folder / "model.safetensors").write_bytes(b"weighTs" + b"weights" * 9)
    assert checkpoint_problem(folder) == (
        "model.safetensors does not hold the bytes that were written (its sha256 differs)"
    )


def make_sizes_only_checkpoint(root, step):
    """A checkpoint whose manifest was written before content hashes were recorded."""
    folder = make_checkpoint(root, step)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"] = {name: record["size"] for name, record in manifest["files"].items()}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_a_sizes_only_manifest_is_checked_by_size_with_a_warning_that_bytes_are_not(tmp_path, caplog):
    folder = make_sizes_only_checkpoint(tmp_path, 2)
    (folder / "model.safetensors").write_bytes(b"weighTs" + b"weights" * 9)
    with caplog.at_level(logging.WARNING, logger="finetune"):
        assert checkpoint_problem(folder) is None
    assert "holds file sizes only" in caplog.text


def test_a_sizes_only_manifest_still_catches_a_truncated_file(tmp_path):
    folder = make_sizes_only_checkpoint(tmp_path, 2)
    (folder / "model.safetensors").write_bytes(b"weights")
    assert checkpoint_problem(folder) == "model.safetensors has 7 bytes, 70 were written"


def test_resume_skips_a_checkpoint_with_damaged_bytes_for_the_older_good_one(tmp_path, caplog):
    good = make_checkpoint(tmp_path, 2)
    damaged = make_checkpoint(tmp_path, 4)
    (damaged / "trainer_state.json").write_bytes(b'{"global_step": 5}')  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="finetune"):
        assert checkpoint_to_resume(str(tmp_path), resume=True, resume_from=None) == good
    assert f"skipping {damaged}: trainer_state.json does not hold the bytes" in caplog.text


def test_export_of_a_checkpoint_with_damaged_bytes_is_refused_naming_the_file(tmp_path):
    folder = make_checkpoint(tmp_path, 2, {"config.json": b"{}", "model.safetensors": b"weights"})
    (folder / "model.safetensors").write_bytes(b"weighTs")
    with pytest.raises(FinetuneError, match=r"checkpoint-2: model\.safetensors does not hold the bytes"):
        export_checkpoint(folder, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_export_of_a_path_that_does_not_exist_says_so(tmp_path):
    with pytest.raises(FinetuneError, match=r"checkpoint-9: no such checkpoint folder"):
        export_checkpoint(tmp_path / "checkpoint-9", tmp_path / "export")


def test_truncated_file_is_a_problem(tmp_path):
    folder = make_checkpoint(tmp_path, 2)
    (folder / "model.safetensors").write_bytes(b"weights")
    assert checkpoint_problem(folder) == "model.safetensors has 7 bytes, 70 were written"


def test_missing_file_is_a_problem(tmp_path):
    folder = make_checkpoint(tmp_path, 2)
    (folder / "model.safetensors").unlink()
    assert "model.safetensors: No such file" in checkpoint_problem(folder)


def test_checkpoint_without_manifest_was_not_completely_written(tmp_path):
    folder = make_checkpoint(tmp_path, 2)
    (folder / MANIFEST).unlink()
    assert "not completely written" in checkpoint_problem(folder)


def test_damaged_manifest_is_a_problem(tmp_path):
    folder = make_checkpoint(tmp_path, 2)
    (folder / MANIFEST).write_text('{"step": 2, "fi')
    assert checkpoint_problem(folder) == f"{MANIFEST} is damaged"


def test_newest_good_checkpoint_wins_and_bad_ones_are_skipped_with_a_warning(tmp_path, caplog):
    make_checkpoint(tmp_path, 2)
    good = make_checkpoint(tmp_path, 10)
    bad = make_checkpoint(tmp_path, 12)
    (bad / "model.safetensors").write_bytes(b"")
    (tmp_path / ".staging" / "checkpoint-14").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="finetune"):
        assert latest_good_checkpoint(tmp_path) == good
    assert f"skipping {bad}" in caplog.text


def test_checkpoints_are_ordered_by_step_not_by_name(tmp_path):
    make_checkpoint(tmp_path, 9)
    newest = make_checkpoint(tmp_path, 10)
    assert latest_good_checkpoint(tmp_path) == newest


def test_resume_without_any_checkpoint_starts_fresh(tmp_path):
    assert checkpoint_to_resume(str(tmp_path), resume=True, resume_from=None) is None


def test_no_resume_flag_means_no_checkpoint(tmp_path):
    make_checkpoint(tmp_path, 2)
    assert checkpoint_to_resume(str(tmp_path), resume=False, resume_from=None) is None


def test_resume_from_a_damaged_checkpoint_is_an_error(tmp_path):
    folder = make_checkpoint(tmp_path, 2)
    (folder / "trainer_state.json").write_bytes(b"")
    with pytest.raises(FinetuneError, match=r"trainer_state\.json has 0 bytes"):
        checkpoint_to_resume(str(tmp_path), resume=False, resume_from=str(folder))


def test_resume_from_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FinetuneError, match="no such folder"):
        checkpoint_to_resume(str(tmp_path), resume=False, resume_from=str(tmp_path / "nope"))


def test_publishing_replaces_an_older_copy_in_one_rename(tmp_path):
    old = make_checkpoint(tmp_path, 4)
    staged = make_checkpoint(tmp_path / ".staging", 4, {"model.safetensors": b"new"})
    publish(staged, old)
    assert (old / "model.safetensors").read_bytes() == b"new"
    assert not staged.exists()
    assert sorted(p.name for p in (tmp_path / ".staging").iterdir()) == []


@pytest.fixture
def events(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    before = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    yield args, TrainerState(), TrainerControl()
    for number, handler in before.items():
        signal.signal(number, handler)


def test_signal_saves_and_stops_at_the_next_step_end(events):
    _, state, control = events
    callback = SaveAndStopOnSignal()
    callback.on_train_begin(*events)
    try:
        callback.on_step_end(*events)
        assert not control.should_save
        os.kill(os.getpid(), signal.SIGUSR1)
        state.global_step = 7
        callback.on_step_end(*events)
    finally:
        callback.on_train_end(*events)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert (callback.received, callback.stopped_at_step) == ("SIGUSR1", 7)


def test_a_repeated_stop_signal_still_saves_at_the_next_step_end(events):
    """What a rank gets when SLURM signals the whole job: its own SIGTERM and the launcher's."""
    _, state, control = events
    callback = SaveAndStopOnSignal()
    callback.on_train_begin(*events)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        state.global_step = 3
        callback.on_step_end(*events)
    finally:
        callback.on_train_end(*events)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert (callback.received, callback.stopped_at_step) == ("SIGTERM", 3)


def stop_on_two_ranks(rank: int, store: str, results: str, backend: str) -> None:
    """One rank: rank 1 alone gets SIGUSR1 before the step ends; each writes what it saw."""
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=2)
    args, state, control = SimpleNamespace(device=torch.device("cpu")), TrainerState(), TrainerControl()
    state.global_step = 4
    callback = SaveAndStopOnSignal()
    callback.on_train_begin(args, state, control)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGUSR1)
    callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)
    dist.destroy_process_group()
    seen = f"{callback.received} {callback.stopped_at_step} {control.should_save}"
    Path(results, str(rank)).write_text(seen)


# "cpu:gloo" is not plain gloo: the ranks agree over a gloo group of their own, as they do under NCCL
@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo"])
@pytest.mark.integration
def test_a_signal_on_one_rank_stops_every_rank_naming_that_signal(tmp_path, backend):
    arguments = (str(tmp_path / "store"), str(tmp_path), backend)
    torch.multiprocessing.spawn(stop_on_two_ranks, args=arguments, nprocs=2)
    assert [(tmp_path / str(rank)).read_text() for rank in (0, 1)] == ["SIGUSR1 4 True"] * 2


def test_a_signal_after_the_last_step_end_is_still_the_runs_stop(events):
    """run.py then records the run as interrupted, as for a signal within training."""
    _, state, _ = events
    callback = SaveAndStopOnSignal()
    callback.on_train_begin(*events)
    state.global_step = 5
    callback.on_step_end(*events)
    os.kill(os.getpid(), signal.SIGTERM)
    callback.on_train_end(*events)
    assert (callback.received, callback.stopped_at_step) == ("SIGTERM", 5)


def test_handlers_are_restored_when_training_ends(events):
    before = signal.getsignal(signal.SIGTERM)
    callback = SaveAndStopOnSignal()
    callback.on_train_begin(*events)
    callback.on_train_end(*events)
    assert signal.getsignal(signal.SIGTERM) is before


def test_after_a_stop_the_launchers_sigterm_cannot_kill_a_rank_on_its_way_out(events):
    callback = SaveAndStopOnSignal()
    callback.on_train_begin(*events)
    os.kill(os.getpid(), signal.SIGUSR1)
    callback.on_step_end(*events)
    callback.on_train_end(*events)
    assert [signal.getsignal(number) for number in STOP_SIGNALS] == [signal.SIG_IGN] * len(STOP_SIGNALS)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("not json", "trainer_state.json is not readable JSON"),
        ('["a list"]', "must hold a JSON object, not list"),
        ('{"global_step": 3, "extra": 1}', "keys the Trainer does not know: extra"),
        ('{"global_step": "3"}', "global_step is '3', not int"),
        ('{"global_step": true}', "global_step is True, not int"),
        ('{"global_step": -5}', "global_step is -5, below 0"),
        ('{"global_step": 9, "max_steps": 6}', "global_step 9 is past max_steps 6"),
        ('{"log_history": {}}', "log_history is {}, not list"),
    ],
)
def test_a_trainer_state_the_trainer_cannot_trust_is_a_problem_of_its_checkpoint(tmp_path, content, problem):
    (tmp_path / "trainer_state.json").write_text(content)
    write_manifest(tmp_path, 3, "run")  # recomputed over the edited file: the hashes cannot tell
    assert problem in checkpoint_problem(tmp_path)


@pytest.mark.parametrize(
    ("state", "manifest_step", "problem"),
    [
        ("{}", 20, "global_step is None, the folder's name step 20"),
        ('{"global_step": 5}', 20, "global_step is 5, the folder's name step 20"),
        ('{"global_step": 20}', 5, "says step 5, the folder's name step 20"),
    ],
)
def test_a_step_that_disagrees_with_the_folders_name_is_a_problem(tmp_path, state, manifest_step, problem):
    """The Trainer would continue from trainer_state.json's step while the run says the folder's."""
    checkpoint = tmp_path / "checkpoint-20"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(state)
    write_manifest(checkpoint, manifest_step, "run")
    assert problem in checkpoint_problem(checkpoint)


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ([], "lists no files"),
        ({}, "lists no files"),
        ({"x": "big"}, "is not a size and a sha256"),
        ({"/dev/zero": {"size": 1, "sha256": "0"}}, "not inside the checkpoint"),
        ({"../outside": {"size": 1, "sha256": "0"}}, "not inside the checkpoint"),
        ({"pipe": {"size": 0, "sha256": "0"}}, "pipe is not a regular file"),
    ],
)
def test_a_hostile_manifest_is_a_problem_without_opening_anything(tmp_path, files, problem):
    """A FIFO or /dev/zero would make the check wait or read forever; a wrong shape is no traceback."""
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    os.mkfifo(checkpoint / "pipe")
    (checkpoint / MANIFEST).write_text(json.dumps({"step": 3, "files": files}))
    assert problem in checkpoint_problem(checkpoint)


@pytest.mark.parametrize("manifest", ["[]", "{}", '"text"'])
def test_a_manifest_that_is_no_record_is_damaged(tmp_path, manifest):
    (tmp_path / MANIFEST).write_text(manifest)
    assert "is damaged" in checkpoint_problem(tmp_path)


def test_resume_falls_back_from_a_newest_checkpoint_with_a_bad_trainer_state(tmp_path):
    for step, state in ((2, '{"global_step": 2}'), (4, '{"global_step": -5}')):
        checkpoint = tmp_path / f"checkpoint-{step}"
        checkpoint.mkdir()
        (checkpoint / "trainer_state.json").write_text(state)
        write_manifest(checkpoint, step, "run")
    assert checkpoint_to_resume(str(tmp_path), resume=True, resume_from=None) == tmp_path / "checkpoint-2"


def test_a_named_checkpoint_with_a_bad_trainer_state_is_one_error(tmp_path):
    (tmp_path / "trainer_state.json").write_text('{"global_step": "x"}')
    write_manifest(tmp_path, 3, "run")
    with pytest.raises(FinetuneError, match="global_step is 'x', not int"):
        checkpoint_to_resume(str(tmp_path), resume=False, resume_from=str(tmp_path))
