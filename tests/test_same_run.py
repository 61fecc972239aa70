"""Resume means the same run: a checkpoint of another profile, batch geometry or run-defining flag is
refused in one line before data and model are built, and a finished run is not trained further.

The checkpoints here are manifests and trainer states only: refusing and finishing read nothing else,
so `finetune.run.main` answers in seconds, in the pytest process (tests/test_bad_input.py checks that
one-line errors reach the user through `python finetune/run.py` and the launchers).
tests/test_resume.py resumes real checkpoints of every sharded profile (whose identities must then
match) and checks train_loss across a resume.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers import TrainerState

from finetune import run
from finetune.arguments import parse_arguments
from finetune.checkpoint import write_manifest
from finetune.errors import FinetuneError
from finetune.launched import Launch
from finetune.resume import (
    defining_flags,
    how_to_continue,
    refuse_another_run,
    run_differences,
    run_identity,
)
from finetune.run_folder import MANIFEST, SUMMARY_FILE

from launching import PROJECT_ROOT, TINY_MODEL, resolve_and_set_up

FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "64", "--max_steps", "20",
    "--batch_size", "4", "--learning_rate", "3e-3", "--max_eval_samples", "4", "--report_to", "none",
]  # fmt: skip


def identity_of(flags: list[str], **geometry: object) -> dict:
    """The identity a bare `python finetune/run.py FLAGS` computes, with some fields replaced."""
    model_args, data_args, training_args = parse_arguments([*flags, "--output_dir", "unused"])
    launch = Launch.from_environment()
    resolve_and_set_up(training_args, launch)
    identity = run_identity(defining_flags(model_args, data_args, training_args), launch, training_args)
    return {**identity, **geometry}


def make_checkpoint(
    output_dir: Path, step: int, identity: dict | None, max_steps: int = 20, model_only: bool = False
) -> Path:
    checkpoint = output_dir / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    TrainerState(global_step=step, max_steps=max_steps).save_to_json(str(checkpoint / "trainer_state.json"))
    write_manifest(checkpoint, step, "run-a", identity, model_only)
    return checkpoint


@dataclass
class Ended:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_py(capsys, in_process_commands):
    """run_py(output_dir, *flags): `python finetune/run.py FLAGS --output_dir OUTPUT_DIR` in this process."""

    def run_main(output_dir: Path, *extra: str) -> Ended:
        capsys.readouterr()
        try:
            run.main([*FLAGS, "--output_dir", str(output_dir), *extra])
            code = 0
        except SystemExit as exit:
            code = exit.code
        out, err = capsys.readouterr()
        return Ended(code, out, err)

    return run_main


def test_a_checkpoint_of_another_profile_and_process_count_is_refused_in_one_line(tmp_path, run_py):
    zero2 = identity_of(FLAGS, strategy="zero2", distributed_type="DEEPSPEED", zero_stage=2, world_size=2)
    make_checkpoint(tmp_path / "out", 10, zero2)
    result = run_py(tmp_path / "out", "--resume")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("finetune: error:")]
    assert errors == [
        "finetune: error: checkpoint-10 was written by zero2 with 2 processes, micro batch 4 x 1; "
        "this run is single with 1 process, micro batch 4 x 1: resume with the same profile, processes "
        "and flags, or start a new run in another --output_dir"
    ]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_checkpoint_with_optimizer_states_swapped_to_nvme_is_refused_saying_how_to_continue(
    tmp_path, run_py
):
    """DeepSpeed resumes zero3_nvme with a fresh Adam and loses the first step's update (measured on 2
    CPU ranks: the master weights after the first resumed step equal the checkpoint's)."""
    checkpoint = make_checkpoint(tmp_path / "out", 10, identity_of(FLAGS))
    (checkpoint / "global_step10" / "offloaded_tensors" / "rank00").mkdir(parents=True)
    result = run_py(tmp_path / "out", "--resume")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("finetune: error:")]
    assert len(errors) == 1
    assert "swapped to NVMe" in errors[0] and f"finetune export {checkpoint} DIR" in errors[0]
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_stopped_run_tells_a_zero3_nvme_checkpoint_to_export_and_any_other_to_resume(tmp_path):
    plain = make_checkpoint(tmp_path / "plain", 10, None)
    swapped = make_checkpoint(tmp_path / "swapped", 10, None)
    (swapped / "global_step10" / "offloaded_tensors").mkdir(parents=True)
    assert how_to_continue(plain) == "run the same command with --resume to continue"
    exported = f"start a new run from its weights: finetune export {swapped} DIR, then --model DIR"
    assert how_to_continue(str(swapped)) == exported


def test_a_save_only_model_runs_checkpoints_say_they_hold_the_model_only(tmp_path, run_py):
    result = run_py(tmp_path / "out", "--max_steps", "2", "--save_steps", "2", "--save_only_model")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "checkpoint-2" / MANIFEST).read_text())["model_only"] is True


def test_a_checkpoint_records_the_absolute_place_its_runs_data_was_read_from(tmp_path, run_py):
    """So that an evaluation of it, or of its export, knows the run's data by any path to the same files."""
    result = run_py(tmp_path / "out", "--max_steps", "2", "--save_steps", "2", "--save_only_model")
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = json.loads((tmp_path / "out" / "checkpoint-2" / MANIFEST).read_text())["run"]["data_source"]
    summary = json.loads((tmp_path / "out" / SUMMARY_FILE).read_text())
    assert Path(recorded).is_absolute() and Path(recorded).is_dir()
    assert recorded == summary["data_source"]


def test_resuming_a_model_only_checkpoint_is_refused_saying_to_start_from_its_weights(tmp_path, run_py):
    """transformers would resume it with a fresh optimizer and learning-rate schedule, without a word."""
    checkpoint = make_checkpoint(tmp_path / "out", 10, identity_of(FLAGS), model_only=True)
    result = run_py(tmp_path / "out", "--resume")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("finetune: error:")]
    assert len(errors) == 1 and "holds the model only (--save_only_model)" in errors[0]
    assert f"finetune export {checkpoint} DIR" in errors[0]
    assert how_to_continue(checkpoint).startswith("start a new run from its weights")


def test_a_checkpoint_with_another_learning_rate_is_refused_naming_both_values(tmp_path, run_py):
    written = identity_of([*FLAGS, "--learning_rate", "1e-3"])
    make_checkpoint(tmp_path / "out", 10, written)
    result = run_py(tmp_path / "out", "--resume")
    assert result.returncode == 2
    assert (
        "checkpoint-10 was written with --learning_rate 0.001; this run has --learning_rate 0.003"
        in result.stderr
    )


@pytest.mark.parametrize(
    ("flag", "written", "shown"),
    [
        ("--data_format", "question_answer", "question_answer; this run has --data_format auto"),
        ("--train_on_prompt", "true", "true; this run has --train_on_prompt false"),
        ("--chat_template", "chat.jinja", "chat.jinja; this run has --chat_template unset"),
        ("--packing", "false", "false; this run has --packing true"),
    ],
)
def test_a_checkpoint_with_other_instruction_data_flags_is_refused(tmp_path, run_py, flag, written, shown):
    make_checkpoint(tmp_path / "out", 10, identity_of([*FLAGS, flag, written]))
    result = run_py(tmp_path / "out", "--resume")
    assert result.returncode == 2
    assert f"checkpoint-10 was written with {flag} {shown}" in result.stderr


def test_a_finished_checkpoint_is_not_trained_further_and_the_summary_is_untouched(tmp_path, run_py):
    output_dir = tmp_path / "out"
    make_checkpoint(output_dir, 20, identity_of(FLAGS))
    summary = output_dir / SUMMARY_FILE
    summary.write_text(json.dumps({"status": "completed", "train_loss": 10.6}))
    before = summary.read_bytes()
    result = run_py(output_dir, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stdout.splitlines() if line.startswith("finetune:")] == [
        f"finetune: {output_dir / 'checkpoint-20'} is the last step of its run (20 of 20): nothing to do"
    ]
    assert summary.read_bytes() == before
    assert sorted(path.name for path in output_dir.iterdir() if not path.name.startswith(".")) == [
        "checkpoint-20",
        SUMMARY_FILE,
    ]


def test_resume_of_a_completed_run_without_checkpoints_does_nothing(tmp_path, run_py):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / SUMMARY_FILE).write_text(json.dumps({"status": "completed"}))
    result = run_py(output_dir, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "has completed (run_summary.json): nothing to do" in result.stdout


def test_world_size_and_accumulation_changes_pass_with_allow_world_size_change(tmp_path):
    written = identity_of(FLAGS, strategy="ddp", world_size=2, gradient_accumulation_steps=1)
    checkpoint = make_checkpoint(tmp_path, 10, written)
    current = identity_of(FLAGS, gradient_accumulation_steps=2)
    assert {d.field for d in run_differences(written, current)} == {
        "world_size",
        "gradient_accumulation_steps",
    }
    refuse_another_run(checkpoint, current, allow_world_size_change=True, is_main_process=True)


def test_without_allow_world_size_change_a_process_count_change_is_refused_and_the_flag_named(tmp_path):
    checkpoint = make_checkpoint(tmp_path, 10, identity_of(FLAGS, strategy="ddp", world_size=2))
    with pytest.raises(
        Exception, match=r"ddp with 2 processes.*single with 1 process.*--allow_world_size_change"
    ):
        refuse_another_run(
            checkpoint, identity_of(FLAGS), allow_world_size_change=False, is_main_process=True
        )


def test_a_micro_batch_change_is_refused_even_with_allow_world_size_change(tmp_path):
    checkpoint = make_checkpoint(tmp_path, 10, identity_of(FLAGS, micro_batch_size=8))
    with pytest.raises(FinetuneError, match=r"micro batch 8 x 1.*micro batch 4 x 1"):
        refuse_another_run(checkpoint, identity_of(FLAGS), allow_world_size_change=True, is_main_process=True)


def test_a_checkpoint_without_a_run_identity_resumes_with_a_warning(tmp_path, caplog):
    checkpoint = make_checkpoint(tmp_path, 10, None)
    refuse_another_run(checkpoint, identity_of(FLAGS), allow_world_size_change=False, is_main_process=True)
    assert "does not record the run that wrote it" in caplog.text


def test_speed_and_memory_flags_do_not_make_another_run():
    plain = identity_of(FLAGS)
    tuned = identity_of([*FLAGS, "--gradient_checkpointing", "true", "--chunked_loss", "true"])
    assert run_differences(plain, tuned) == []


def test_the_identity_survives_the_manifest_unchanged(tmp_path):
    identity = identity_of(FLAGS)
    checkpoint = make_checkpoint(tmp_path, 10, identity)
    recorded = json.loads((checkpoint / "finetune_checkpoint.json").read_text())["run"]
    assert run_differences(recorded, identity) == []


def test_a_zero2_launch_is_named_as_its_profile_in_the_identity(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(PROJECT_ROOT / "ds_configs" / "zero2.json"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert Launch.from_environment().strategy_fields() == {
        "distributed_type": "DEEPSPEED",
        "world_size": 2,
        "data_parallel_size": 2,
        "sequence_parallel_size": 1,
        "zero_stage": 2,
        "strategy": "zero2",
    }


def test_a_checkpoint_naming_its_strategy_the_former_way_continues_as_the_same_run():
    recorded = {"strategy": "zero3+offload_cpu", "world_size": 2, "micro_batch_size": 4,
                "gradient_accumulation_steps": 1, "flags": {}}  # fmt: skip
    current = {**recorded, "strategy": "zero3_offload"}
    assert run_differences(recorded, current) == []


def test_a_last_step_checkpoint_of_a_run_that_did_not_complete_says_how_to_get_its_model(tmp_path, run_py):
    output_dir = tmp_path / "out"
    checkpoint = make_checkpoint(output_dir, 20, identity_of(FLAGS))
    (output_dir / SUMMARY_FILE).write_text(json.dumps({"status": "failed", "train_loss": 10.6}))
    result = run_py(output_dir, "--resume")
    assert result.returncode == 2
    assert f"finetune export {checkpoint} DIR" in result.stderr
    assert "did not complete (run_summary.json: failed)" in result.stderr
