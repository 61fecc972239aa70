"""No file in a checkpoint or model folder runs code, through any reader: resume, export, eval, generate.

Each hostile file is a pickle whose loading would run `touch MARKER` (through `__reduce__`), or a
config whose `auto_map` points at custom code that would create the marker when imported. It is
planted in a copy of a checkpoint of the profile's reference run (tests/runs.py) with the
manifest's file records refreshed, as an attacker who can write the folder would. Every command
must leave no marker and, where it needs the file, fail with one `finetune: error:` line naming it.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from finetune import cli
from finetune.checkpoint import file_records, load_weights_only
from finetune.errors import FinetuneError
from finetune.run_folder import MANIFEST

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, accelerate_launch
from runs import CHECKPOINT_STEPS, FLAGS, copy_checkpoint

FIRST = CHECKPOINT_STEPS[0]  # resumed (training would continue from it)
LAST = CHECKPOINT_STEPS[-1]  # exported (the trained model)


class WritesMarker:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


EVIL_CODE = "from pathlib import Path\nPath({marker!r}).touch()\n"


@pytest.fixture(autouse=True)
def restore_loaders(in_process_commands):
    """The in-process commands install the restricted readers; undo that for the rest of the session."""


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "MARKER"
    yield path
    assert not path.exists(), "a hostile file ran code"


def refresh_manifest(checkpoint: Path) -> None:
    """Record the planted files as the checkpoint's own: the hash check is no defence against this."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["files"] = file_records(checkpoint)
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))


def plant_pickle(path: Path, marker: Path) -> None:
    """A plain pickle for DCP `.metadata`, a torch.save archive for `.pt/.pth/.bin` files."""
    if path.suffix in (".pt", ".pth", ".bin"):
        torch.save({"state": WritesMarker(marker)}, path)
    else:
        path.write_bytes(pickle.dumps(WritesMarker(marker)))


def plant_custom_code(folder: Path, marker: Path) -> None:
    """A config whose architecture exists only as code in the folder, which would create the marker."""
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "evil"
    config["auto_map"] = {
        name: "evil.Evil" for name in ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer")
    }
    (folder / "config.json").write_text(json.dumps(config))


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("finetune: error:")]


def assert_one_error_line_naming(text: str, name: str) -> None:
    lines = error_lines(text)
    assert lines and all(line == lines[0] for line in lines), text[-3000:]
    assert name in lines[0]
    assert "Traceback" not in text.split("finetune: error:")[0], "a rank printed a traceback"


def resume(checkpoint: Path, profile: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*accelerate_launch(profile), *FLAGS, "--output_dir", str(checkpoint.parent), "--resume"],
        cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip


RESUME_READERS = [
    ("fsdp", "pytorch_model_fsdp_0/.metadata"),
    ("fsdp", "optimizer_0/.metadata"),
    ("zero2", f"global_step{FIRST}/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ("zero2", f"global_step{FIRST}/mp_rank_00_model_states.pt"),
    ("ddp", "optimizer.pt"),
    ("ddp", "scheduler.pt"),
    ("ddp", "rng_state_1.pth"),
]
# One file per framework's reader through a real 2-rank --resume: the others go through the same
# readers (torch.load made weights-only, DCP's metadata read restricted), checked in this process.
RESUMED_FOR_REAL = [RESUME_READERS[0], RESUME_READERS[2], RESUME_READERS[4]]


def read_as_a_resume_does(path: Path) -> None:
    """The two ways checkpoint files are read: DCP's metadata reader, and torch.load asked for a full
    unpickling (what DeepSpeed asks for) that the installed guard must refuse anyway."""
    if path.name == ".metadata":
        FileSystemReader(str(path.parent)).read_metadata()
    else:
        torch.load(path, weights_only=False)


@pytest.mark.integration
@pytest.mark.parametrize(("profile", "name"), RESUME_READERS, ids=[f"{p}-{n}" for p, n in RESUME_READERS])
def test_every_file_a_resume_reads_is_refused_by_the_installed_readers_without_running(
    reference_run, tmp_path, marker, profile, name
):
    checkpoint = copy_checkpoint(reference_run(profile), tmp_path / "out", FIRST)
    plant_pickle(checkpoint / name, marker)
    load_weights_only()
    with pytest.raises(FinetuneError, match=re.escape(name)):
        read_as_a_resume_does(checkpoint / name)


@pytest.mark.integration
@pytest.mark.parametrize(("profile", "name"), RESUMED_FOR_REAL, ids=[f"{p}-{n}" for p, n in RESUMED_FOR_REAL])
def test_resume_refuses_a_hostile_pickle_in_one_line_without_running_it(
    reference_run, tmp_path, marker, profile, name
):
    checkpoint = copy_checkpoint(reference_run(profile), tmp_path / "out", FIRST)
    plant_pickle(checkpoint / name, marker)
    refresh_manifest(checkpoint)
    result = resume(checkpoint, profile)
    assert result.returncode != 0
    assert_one_error_line_naming(result.stderr, name)


@pytest.mark.integration
def test_resume_never_reads_training_args_bin(reference_run, tmp_path, marker):
    """Resumed from the checkpoint before the last: the run finishes in a few steps."""
    checkpoint = copy_checkpoint(reference_run("ddp"), tmp_path / "out", CHECKPOINT_STEPS[-2])
    plant_pickle(checkpoint / "training_args.bin", marker)
    refresh_manifest(checkpoint)
    result = resume(checkpoint, "ddp")
    assert result.returncode == 0, result.stderr[-3000:]


def export(checkpoint: Path, destination: Path, capsys) -> tuple[int, str]:
    """`finetune export` in this process: its exit code and what it printed to stderr."""
    try:
        code = cli.main(["export", str(checkpoint), str(destination)])
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


EXPORT_READERS = [
    ("fsdp", "pytorch_model_fsdp_0/.metadata"),
    ("zero2", f"global_step{LAST}/zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    ("zero2", f"global_step{LAST}/mp_rank_00_model_states.pt"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("profile", "name"), EXPORT_READERS, ids=[f"{p}-{n}" for p, n in EXPORT_READERS])
def test_export_refuses_a_hostile_pickle_in_one_line_without_running_it(
    reference_run, tmp_path, marker, capsys, profile, name
):
    checkpoint = copy_checkpoint(reference_run(profile), tmp_path, LAST)
    plant_pickle(checkpoint / name, marker)
    refresh_manifest(checkpoint)
    code, err = export(checkpoint, tmp_path / "export", capsys)
    assert code == 2
    assert_one_error_line_naming(err, name)


@pytest.mark.integration
def test_export_reads_no_pickle_a_ddp_checkpoint_holds(reference_run, tmp_path, marker, capsys):
    checkpoint = copy_checkpoint(reference_run("ddp"), tmp_path, LAST)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state_0.pth", "training_args.bin"):
        plant_pickle(checkpoint / name, marker)
    refresh_manifest(checkpoint)
    code, err = export(checkpoint, tmp_path / "export", capsys)
    assert code == 0, err
    assert (tmp_path / "export" / "model.safetensors").is_file()


@pytest.mark.integration
def test_export_never_runs_custom_code_even_if_the_terminal_says_yes(
    reference_run, tmp_path, marker, capsys, monkeypatch
):
    monkeypatch.setattr("builtins.input", lambda prompt="": "y")
    checkpoint = copy_checkpoint(reference_run("ddp"), tmp_path, LAST)
    plant_custom_code(checkpoint, marker)
    refresh_manifest(checkpoint)
    code, err = export(checkpoint, tmp_path / "export", capsys)
    assert code == 2
    assert_one_error_line_naming(err, "custom code")


@pytest.mark.integration
def test_export_of_a_checkpoint_with_bytes_damaged_and_size_kept_fails_in_one_line(
    reference_run, tmp_path, capsys
):
    checkpoint = copy_checkpoint(reference_run("ddp"), tmp_path, LAST)
    weights = bytearray((checkpoint / "model.safetensors").read_bytes())
    weights[-1] ^= 0xFF
    (checkpoint / "model.safetensors").write_bytes(bytes(weights))
    code, err = export(checkpoint, tmp_path / "export", capsys)
    assert code == 2
    assert_one_error_line_naming(err, "model.safetensors does not hold the bytes that were written")


@pytest.fixture
def model_folder(tiny_gpt2_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_gpt2_dir, folder)
    return folder


def use_model(command: str, folder: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    """`finetune eval` or `finetune generate` on the folder, in this process: exit code and stderr."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    arguments = {
        "eval": ["eval", str(folder), "--dataset", str(text), "--split", "train", "--block_size", "16"],
        "generate": ["generate", str(folder), "--prompt", "the", "--max_new_tokens", "2"],
    }[command]
    try:
        code = cli.main(arguments)
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_a_hostile_pytorch_model_bin_is_refused_in_one_line(model_folder, tmp_path, marker, capsys, command):
    (model_folder / "model.safetensors").unlink()
    plant_pickle(model_folder / "pytorch_model.bin", marker)
    code, err = use_model(command, model_folder, tmp_path, capsys)
    assert code == 2
    assert_one_error_line_naming(err, "pytorch_model.bin")


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_custom_code_in_a_model_folder_never_runs_even_if_the_terminal_says_yes(
    model_folder, tmp_path, marker, capsys, monkeypatch, command
):
    monkeypatch.setattr("builtins.input", lambda prompt="": "y")
    plant_custom_code(model_folder, marker)
    code, err = use_model(command, model_folder, tmp_path, capsys)
    assert code == 2
    assert_one_error_line_naming(err, "custom code")


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_a_truncated_safetensors_file_is_refused_in_one_line(model_folder, tmp_path, capsys, command):
    weights = model_folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, err = use_model(command, model_folder, tmp_path, capsys)
    assert code == 2, err[-2000:]
    assert_one_error_line_naming(err, "model.safetensors")


def test_a_chat_template_the_sandbox_refuses_is_one_line_in_generate_chat(model_folder, capsys):
    escape = (
        "{{ ''.__class__.__mro__[1].__subclasses__() }}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    (model_folder / "chat_template.jinja").write_text(escape)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["generate", str(model_folder), "--chat", "--prompt", "hi", "--max_new_tokens", "2"])
    assert stopped.value.code == 2
    assert_one_error_line_naming(capsys.readouterr().err, "SecurityError")


@pytest.mark.integration
def test_a_refusal_on_one_rank_stops_the_other_without_its_traceback(reference_run, tmp_path, marker):
    """rng_state_1.pth is read by rank 1 alone; rank 0 is then waiting in a collective."""
    checkpoint = copy_checkpoint(reference_run("ddp"), tmp_path / "out", FIRST)
    plant_pickle(checkpoint / "rng_state_1.pth", marker)
    refresh_manifest(checkpoint)
    command = [sys.executable, "-m", "finetune", "run", "--profile", "ddp", "--num_processes", "2", *FLAGS,
               "--output_dir", str(checkpoint.parent), "--resume"]  # fmt: skip
    result = subprocess.run(command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True,
                            timeout=LAUNCH_TIMEOUT_S)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert_one_error_line_naming(result.stderr, "rng_state_1.pth")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not marker.exists()
