"""An output folder belongs to one run: earlier results are kept, a live run's folder is locked, ranks
die with their launcher, and `finetune export` never writes over results."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from finetune import cli, outputs, run
from finetune.errors import FinetuneError
from finetune.outputs import claim_on_main, earlier_results, lock_output_dir, read_holder, unlock_output_dir
from finetune.run_folder import LOCK_FILE, MANIFEST, REPLACED_DIR
from finetune.summary import read_summary

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL, accelerate_launch, launch
from runs import FLAGS, SAVE_STEPS

RUN_FLAGS = [
    *TINY_MODEL, "--block_size", "64", "--max_steps", "2", "--max_eval_samples", "4", "--report_to", "none"
]  # fmt: skip


@pytest.fixture(autouse=True)
def commands_in_this_process(in_process_commands):
    """run.main and cli.main run in the pytest process here; what they install stays in each test."""


def earlier_run(output_dir: Path) -> Path:
    """A folder as a finished run leaves it, plus a file of the user's."""
    (output_dir / "checkpoint-5").mkdir(parents=True)
    (output_dir / "checkpoint-5" / MANIFEST).write_text("{}")
    (output_dir / "model.safetensors").write_bytes(b"weights")
    (output_dir / "run_summary.json").write_text(json.dumps({"status": "completed", "steps": 5}))
    (output_dir / "notes.txt").write_text("mine")
    return output_dir


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def top_level(folder: Path) -> list[str]:
    """The folder's own entries, less what --overwrite_output_dir set aside."""
    return sorted(path.name for path in folder.iterdir() if path.name != REPLACED_DIR)


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: error:")]


def warnings(monkeypatch) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(outputs.logger, "warning", said.append)
    return said


def start_python(code: str, *args: str) -> subprocess.Popen[str]:
    """A helper process that prints `ready` once it has done what the test needs."""
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=PROJECT_ROOT,
        env=ENVIRONMENT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


LOCK_AND = "import os, sys, time; from pathlib import Path; from finetune.outputs import lock_output_dir; "


def test_second_run_into_a_used_output_dir_is_refused_and_touches_nothing(tmp_path, capsys):
    output_dir = earlier_run(tmp_path / "out")
    before = listing(output_dir)
    with pytest.raises(SystemExit) as stopped:
        run.main([*RUN_FLAGS, "--output_dir", str(output_dir)])
    assert stopped.value.code == 2
    (line,) = error_lines(capsys)
    assert "holds another run's results (checkpoint-5, model.safetensors, run_summary.json)" in line
    assert "--resume" in line and "--overwrite_output_dir" in line
    assert listing(output_dir) == before


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [([], "holds another run's results"),
     (["--overwrite_output_dir", "--model", "{out}"], "would delete --model")],
    ids=["another run's results", "overwrite of the model read"],
)  # fmt: skip
def test_finetune_run_refuses_a_folder_not_its_own_before_launching_or_writing_into_it(
    flags, refusal, tmp_path, monkeypatch, capsys
):
    """The launch folder (.launch/) was written into the refused folder, a pretrained model's one too."""
    output_dir = earlier_run(tmp_path / "out")
    before = listing(output_dir)
    monkeypatch.setattr(subprocess, "Popen", lambda *_, **__: pytest.fail("launched"))
    flags = [flag.format(out=output_dir) for flag in flags]
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--profile", "single", *RUN_FLAGS, "--output_dir", str(output_dir), *flags])
    assert stopped.value.code == 2
    (line,) = error_lines(capsys)
    assert refusal in line
    assert listing(output_dir) == before and sorted(output_dir.iterdir()) == sorted(
        output_dir / name for name in ("checkpoint-5", "model.safetensors", "run_summary.json", "notes.txt")
    )


def test_resume_keeps_the_earlier_runs_results(tmp_path):
    output_dir = earlier_run(tmp_path / "out")
    before = listing(output_dir)
    claim_on_main(output_dir, resume=True, overwrite=False)
    assert {name: data for name, data in listing(output_dir).items() if name != LOCK_FILE} == before


def test_resume_given_with_overwrite_output_dir_deletes_nothing(tmp_path):
    output_dir = earlier_run(tmp_path / "out")
    before = listing(output_dir)
    claim_on_main(output_dir, resume=True, overwrite=True)
    assert {name: data for name, data in listing(output_dir).items() if name != LOCK_FILE} == before


def test_overwrite_output_dir_says_what_it_replaces_and_sets_only_that_aside(tmp_path, monkeypatch):
    output_dir = earlier_run(tmp_path / "out")
    said = warnings(monkeypatch)
    claim_on_main(output_dir, resume=False, overwrite=True)
    assert said == [
        f"finetune: --overwrite_output_dir: replacing checkpoint-5, model.safetensors, run_summary.json "
        f"in {output_dir} (deleted at the first training step, put back if the run stops before it)"
    ]
    assert top_level(output_dir) == [LOCK_FILE, "notes.txt"]
    assert sorted(path.name for path in (output_dir / REPLACED_DIR).iterdir()) == [
        "checkpoint-5", "model.safetensors", "run_summary.json"
    ]  # fmt: skip


def test_a_run_refused_after_overwrite_output_dir_puts_the_earlier_results_back(tmp_path, capsys):
    """The global batch is checked against the training set once the data is read, after the claim."""
    output_dir = earlier_run(tmp_path / "out")
    before = listing(output_dir)
    too_few = ["--max_train_samples", "2", "--batch_size", "4", "--overwrite_output_dir"]
    with pytest.raises(SystemExit) as stopped:
        run.main([*RUN_FLAGS, *too_few, "--output_dir", str(output_dir)])
    assert stopped.value.code == 2
    (line,) = error_lines(capsys)
    assert "global batch" in line
    assert {name: data for name, data in listing(output_dir).items() if name != LOCK_FILE} == before


def test_a_run_that_trains_deletes_the_results_overwrite_output_dir_set_aside(tmp_path):
    output_dir = earlier_run(tmp_path / "out")
    run.main([*RUN_FLAGS, "--overwrite_output_dir", "--save_strategy", "no", "--output_dir", str(output_dir)])
    assert read_summary(output_dir)["status"] == "completed"
    assert not (output_dir / REPLACED_DIR).exists() and not (output_dir / "checkpoint-5").exists()
    assert (output_dir / "notes.txt").read_text() == "mine"


def test_results_set_aside_by_a_run_killed_before_its_first_step_are_put_back_by_the_next(tmp_path):
    output_dir = earlier_run(tmp_path / "out")
    before = listing(output_dir)
    claim_on_main(output_dir, resume=False, overwrite=True)
    unlock_output_dir(output_dir)  # as the kernel drops a SIGKILLed holder's lock
    with pytest.raises(FinetuneError, match=r"holds another run's results \(checkpoint-5, model"):
        claim_on_main(output_dir, resume=False, overwrite=False)
    assert {name: data for name, data in listing(output_dir).items() if name != LOCK_FILE} == before


def test_finetune_run_judges_results_a_killed_overwrite_run_set_aside_before_launching(
    tmp_path, monkeypatch, capsys
):
    """Rank 0's claim puts them back, then refuses: the front end refuses them first, launching nothing."""
    output_dir = earlier_run(tmp_path / "out")
    claim_on_main(output_dir, resume=False, overwrite=True)
    unlock_output_dir(output_dir)
    monkeypatch.setattr(subprocess, "Popen", lambda *_, **__: pytest.fail("launched"))
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--profile", "single", *RUN_FLAGS, "--output_dir", str(output_dir)])
    assert stopped.value.code == 2
    (line,) = error_lines(capsys)
    assert "holds another run's results (checkpoint-5, model.safetensors, run_summary.json)" in line


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_summary_of_a_run_stopped_before_training_does_not_block_the_folder(tmp_path, status):
    """A typo in a flag, or a Ctrl-C during data preparation: the same command may run again."""
    (tmp_path / "run_summary.json").write_text(json.dumps({"status": status, "steps": None}))
    assert earlier_results(tmp_path) == []


def test_summary_of_a_run_interrupted_after_training_steps_blocks_the_folder(tmp_path):
    (tmp_path / "run_summary.json").write_text(json.dumps({"status": "interrupted", "steps": 3}))
    assert earlier_results(tmp_path) == [tmp_path / "run_summary.json"]


def test_a_live_runs_lock_stops_a_second_run_naming_its_holder(tmp_path, capsys):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    holder = start_python(LOCK_AND + "lock_output_dir(Path(sys.argv[1])); print('ready', flush=True); "
                          "time.sleep(600)", str(output_dir))  # fmt: skip
    try:
        with pytest.raises(SystemExit) as stopped:
            run.main([*RUN_FLAGS, "--output_dir", str(output_dir), "--resume"])
    finally:
        holder.kill()
        holder.wait()
    assert stopped.value.code == 2
    (line,) = error_lines(capsys)
    assert f"is in use by another run (host {socket.gethostname()}, pid {holder.pid}, started" in line


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, monkeypatch):
    # os._exit: no clean-up, as after kill -9
    dead = start_python(LOCK_AND + "lock_output_dir(Path(sys.argv[1])); print('ready', flush=True); "
                        "os._exit(0)", str(tmp_path))  # fmt: skip
    dead.wait()
    said = warnings(monkeypatch)
    lock_output_dir(tmp_path)
    assert read_holder(tmp_path / LOCK_FILE).pid == psutil.Process().pid
    assert said and f"pid {dead.pid}" in said[0]


def test_a_lock_whose_holder_is_gone_is_taken_over_though_a_child_keeps_the_flock(tmp_path, monkeypatch):
    code = LOCK_AND + (
        "import subprocess; lock = lock_output_dir(Path(sys.argv[1])); "
        "child = subprocess.Popen(['sleep', '600'], pass_fds=[lock.fd]); print(child.pid); "
        "print('ready', flush=True); os._exit(0)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=PROJECT_ROOT, env=ENVIRONMENT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    child = psutil.Process(int(process.stdout.readline()))
    assert process.stdout.readline().strip() == "ready"
    process.wait()
    said = warnings(monkeypatch)
    try:
        lock_output_dir(tmp_path)
    finally:
        child.kill()
    assert read_holder(tmp_path / LOCK_FILE).pid == psutil.Process().pid
    (warning,) = said
    assert warning.startswith(f"finetune: taking over {tmp_path / LOCK_FILE} from a run that is gone (host "
                              f"{socket.gethostname()}, pid {process.pid}, started ")  # fmt: skip


def test_the_lock_is_released_at_exit(tmp_path):
    finished = start_python(LOCK_AND + "lock_output_dir(Path(sys.argv[1])); print('ready', flush=True)",
                            str(tmp_path))  # fmt: skip
    assert finished.wait() == 0
    assert not (tmp_path / LOCK_FILE).exists()


# ---------------------------------------------------------------------------------------------------
# finetune export


def checkpoint_of_a_run(tmp_path: Path) -> Path:
    checkpoint = tmp_path / "run" / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    return checkpoint


def export_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["export", *argv])
    assert stopped.value.code == 2
    (line,) = error_lines(capsys)
    return line


def test_export_into_the_runs_own_output_dir_is_refused_even_with_overwrite(tmp_path, capsys):
    checkpoint = checkpoint_of_a_run(tmp_path)
    line = export_error([str(checkpoint), str(checkpoint.parent), "--overwrite"], capsys)
    assert "is the output_dir of the run that saved" in line


def test_export_into_a_folder_with_files_is_refused_without_overwrite(tmp_path, capsys):
    checkpoint = checkpoint_of_a_run(tmp_path)
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "model.safetensors").write_bytes(b"earlier export")
    line = export_error([str(checkpoint), str(tmp_path / "export")], capsys)
    assert line.endswith("is not empty: pass --overwrite to replace what is in it")


def test_export_into_another_runs_folder_is_refused_even_with_overwrite(tmp_path, capsys):
    checkpoint = checkpoint_of_a_run(tmp_path)
    other_run = tmp_path / "other"
    other_run.mkdir()
    (other_run / "run_summary.json").write_text("{}")
    line = export_error([str(checkpoint), str(other_run), "--overwrite"], capsys)
    assert "holds a run's results" in line and "never a run" in line


def test_export_into_a_live_runs_folder_is_refused_even_with_overwrite(tmp_path, capsys):
    checkpoint = checkpoint_of_a_run(tmp_path)
    live = tmp_path / "live"
    live.mkdir()
    lock_output_dir(live)  # this process holds it, as rank 0 of a running run does
    try:
        line = export_error([str(checkpoint), str(live), "--overwrite"], capsys)
    finally:
        unlock_output_dir(live)
    assert "is the output_dir of a running run" in line


def test_export_of_a_run_folder_names_its_newest_checkpoint(tmp_path, capsys):
    checkpoint = checkpoint_of_a_run(tmp_path)
    (checkpoint.parent / "checkpoint-10").mkdir()
    line = export_error([str(checkpoint.parent), str(tmp_path / "export")], capsys)
    assert (
        "is a run's output_dir, not a checkpoint" in line and str(checkpoint.parent / "checkpoint-10") in line
    )


def test_export_to_a_path_that_is_a_file_is_refused(tmp_path, capsys):
    checkpoint = checkpoint_of_a_run(tmp_path)
    (tmp_path / "model.bin").write_bytes(b"x")
    line = export_error([str(checkpoint), str(tmp_path / "model.bin"), "--overwrite"], capsys)
    assert "is a file, not a folder" in line


# ---------------------------------------------------------------------------------------------------
# Real 2-rank runs


@pytest.mark.integration
def test_every_rank_stops_when_the_folder_holds_another_runs_results(tmp_path):
    output_dir = earlier_run(tmp_path / "out")
    before = listing(output_dir)
    result = subprocess.run(
        [*accelerate_launch("ddp"), *RUN_FLAGS, "--output_dir", str(output_dir)],
        cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode != 0
    assert "finetune: error: --output_dir" in result.stderr
    assert "Loading" not in result.stderr and "train_loss" not in result.stdout
    assert listing(output_dir) == before


RANKS_GONE_WITHIN_S = 120
# Long enough that a kill after the first checkpoint lands while the run still trains (a reference run's
# 20 steps take about a second after it).
STILL_TRAINING = ["--max_steps", "200"]


@pytest.mark.integration
def test_kill_9_of_the_launcher_stops_its_ranks_and_resume_then_works(tmp_path):
    output_dir = tmp_path / "out"
    with (tmp_path / "killed.log").open("w") as log:
        launcher = subprocess.Popen(
            [*accelerate_launch("ddp"), *FLAGS, *STILL_TRAINING, "--output_dir", str(output_dir)],
            cwd=PROJECT_ROOT, env=ENVIRONMENT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (output_dir / f"checkpoint-{SAVE_STEPS}" / MANIFEST).exists():
        assert launcher.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ranks = [p for p in psutil.Process(launcher.pid).children() if "finetune/run.py" in " ".join(p.cmdline())]
    assert len(ranks) == 2  # the launcher itself is the ranks' parent
    launcher.kill()
    launcher.wait()
    _, alive = psutil.wait_procs(ranks, timeout=RANKS_GONE_WITHIN_S)
    for rank in alive:
        rank.kill()
    assert not alive, f"ranks still running {RANKS_GONE_WITHIN_S} s after the launcher was killed"
    stopped = read_summary(output_dir)
    assert stopped["status"] == "interrupted" and stopped["error"].startswith("stopped by SIGTERM")
    launch(accelerate_launch("ddp"), output_dir, [*FLAGS, *STILL_TRAINING, "--resume"])
    resumed = read_summary(output_dir)
    assert resumed["status"] == "completed"
    assert resumed["resumed_from_step"] == stopped["steps"]


def test_overwrite_output_dir_removes_an_adapter_and_universal_checkpoints_too(tmp_path, monkeypatch):
    output_dir = tmp_path / "out"
    (output_dir / "universal-checkpoint-4" / "zero").mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "config.json", "tokenizer.json"):
        (output_dir / name).write_text("{}")
    said = warnings(monkeypatch)
    claim_on_main(output_dir, resume=False, overwrite=True)
    assert "adapter_config.json, adapter_model.safetensors" in said[0] and "universal-checkpoint-4" in said[0]
    assert top_level(output_dir) == [LOCK_FILE]


def test_overwrite_removes_peft_s_model_card_with_the_adapters_but_not_a_readme_alone(tmp_path, monkeypatch):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "README.md").write_text("# my notes")
    assert earlier_results(output_dir) == []
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (output_dir / name).write_text("{}")
    warnings(monkeypatch)
    claim_on_main(output_dir, resume=False, overwrite=True)
    assert top_level(output_dir) == [LOCK_FILE]


@pytest.mark.parametrize("inside", [".", "base"])
def test_overwrite_never_deletes_the_model_the_run_reads(tmp_path, inside):
    """`--model M --output_dir M --overwrite_output_dir` removed the user's model, then failed to load it."""
    output_dir = tmp_path / "out"
    model = output_dir / inside
    model.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        (output_dir / name).write_text("{}")
    with pytest.raises(FinetuneError, match=r"would delete --model .* it lies in --output_dir"):
        claim_on_main(output_dir, resume=False, overwrite=True, inputs={"--model": str(model)})
    assert (output_dir / "model.safetensors").exists()
    claim_on_main(output_dir, resume=False, overwrite=True, inputs={"--model": str(tmp_path / "elsewhere")})


def test_a_folder_holding_only_an_adapter_is_another_runs_results(tmp_path):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "adapter_model.safetensors").write_text("")
    with pytest.raises(FinetuneError, match=r"adapter_model\.safetensors"):
        claim_on_main(output_dir, resume=False, overwrite=False)


@pytest.mark.integration
def test_finetune_run_exits_75_when_its_killed_launchers_ranks_saved_a_checkpoint(tmp_path):
    output_dir = tmp_path / "out"
    command = [sys.executable, "-m", "finetune", "run", "--profile", "ddp", "--num_processes", "2", *FLAGS,
               *STILL_TRAINING, "--output_dir", str(output_dir)]  # fmt: skip
    with (tmp_path / "run.log").open("w") as log:
        run_process = subprocess.Popen(command, cwd=PROJECT_ROOT, env=ENVIRONMENT, stdout=log, stderr=log)
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (output_dir / f"checkpoint-{SAVE_STEPS}" / MANIFEST).exists():
        assert run_process.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    [launcher] = [p for p in psutil.Process(run_process.pid).children() if "finetune.launch" in p.cmdline()]
    launcher.kill()
    assert run_process.wait(timeout=RANKS_GONE_WITHIN_S + 30) == 75, (tmp_path / "run.log").read_text()[
        -3000:
    ]
    assert "its ranks saved" in (tmp_path / "run.log").read_text()
    assert read_summary(output_dir)["status"] == "interrupted"


def test_a_hung_runs_stacks_are_results_that_overwrite_removes_and_doctors_table_is_not(tmp_path):
    (tmp_path / "hang-step3").mkdir()
    (tmp_path / "doctor.json").write_text("[]")  # written by `run --doctor` just before the run claims it
    assert earlier_results(tmp_path) == [tmp_path / "hang-step3"]
