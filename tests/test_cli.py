"""`finetune run`, `compare` and `slurm` read run flags with finetune/run.py's parser and recipes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

import finetune.compare
import finetune.planner
from finetune import cli
from finetune.arguments import parse_arguments
from finetune.commands import evaluate as evaluate_command
from finetune.commands import run as run_command
from finetune.compare import Row
from finetune.profiles import copy_profile


def write_recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


class FinishedLaunch:
    """Stands in for `accelerate launch`: the run it started ends at once, successfully."""

    def __init__(self, command: list[str], **_: object) -> None:
        self.command = command

    def __enter__(self) -> FinishedLaunch:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def wait(self) -> int:
        return 0


def refuse_to_launch(*_: object, **__: object) -> None:
    raise AssertionError("a process was launched")


@pytest.fixture
def planned(monkeypatch) -> list:
    """The (shape, workload) pairs `--profile auto` asks the planner about, on a pretend 80 GiB GPU
    that supports bf16."""
    asked = []

    def choose_profile(shape, workload, layout, memory, global_batch=None):
        asked.append((shape, workload, global_batch))
        return "ddp", "fits"

    monkeypatch.setattr(finetune.planner, "visible_gpu_memory_gib", lambda: 80.0)
    monkeypatch.setattr(finetune.planner, "choose_profile", choose_profile)
    monkeypatch.setattr(run_command, "visible_gpu_supports_bf16", lambda: True)
    monkeypatch.setattr(subprocess, "Popen", FinishedLaunch)
    return asked


def test_profile_auto_weighs_a_global_batch_at_each_profiles_own_micro_batch(planned):
    assert cli.main(["run", "--profile", "auto", "--num_processes", "2", "--global_batch_size", "64"]) == 0
    assert planned[0][2] == 64


def test_profile_auto_plans_the_micro_batch_given_beside_a_global_batch(planned):
    argv = [
        "run",
        "--profile",
        "auto",
        "--num_processes",
        "2",
        "--global_batch_size",
        "64",
        "--batch_size",
        "4",
    ]
    assert cli.main(argv) == 0
    _, workload, global_batch = planned[0]
    assert (workload.micro_batch, global_batch) == (4, None)


def test_profile_auto_plans_the_recipes_model_at_the_batch_size_of_the_flag(tmp_path, planned):
    recipe = write_recipe(tmp_path, "model: gpt2-medium\nbatch_size: 16\nblock_size: 256\n")
    argv = ["run", "--profile", "auto", "--num_processes", "2", str(recipe), "--batch_size", "4"]
    assert cli.main(argv) == 0
    shape, workload, _ = planned[0]
    assert (shape.name, workload.micro_batch, workload.block_size) == ("gpt2-medium", 4, 256)


def test_profile_auto_plans_the_precision_the_run_trains_in(tmp_path, planned):
    run_command.auto_profile(["--model", "gpt2", "--fp16"], 2)
    run_command.auto_profile(["--model", "gpt2", "--precision", "fp32"], 2)
    run_command.auto_profile(["--model", "gpt2"], 2)
    assert [workload.dtype for _, workload, _ in planned] == ["fp16", "fp32", "bf16"]


def test_profile_auto_plans_precision_auto_as_fp16_on_a_gpu_without_bf16(planned, monkeypatch):
    """The launch resolves `--precision auto` to fp16 there (launched.precision_on, one rule)."""
    monkeypatch.setattr(run_command, "visible_gpu_supports_bf16", lambda: False)
    run_command.auto_profile(["--model", "gpt2"], 2)
    assert planned[0][1].dtype == "fp16"


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--profile", "ddp", "--num_processes", "2"],
        ["compare", "--profiles", "ddp", "--num_processes", "2"],
        ["slurm", "--profile", "ddp", "--gpus_per_node", "1", "--output", "job.sbatch"],
    ],
    ids=["run", "compare", "slurm"],
)
def test_an_unknown_run_flag_is_one_line_and_exit_2_before_anything_is_launched(
    command, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(subprocess, "Popen", refuse_to_launch)
    with pytest.raises(SystemExit) as stopped:
        cli.main([*command, "--model", "gpt2", "--learning_rat", "1"])
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: error:")]
    assert len(errors) == 1 and "--learning_rat" in errors[0]
    assert not (tmp_path / "job.sbatch").exists()


@pytest.mark.parametrize(
    ("profile", "refusal"),
    [("ddp", "and the fsdp profiles (torch context parallelism); profile ddp"),
     ("fsdp", "ring attention, which runs on CUDA GPUs only")],
    ids=["a profile that cannot split", "ring attention without GPUs"],
)  # fmt: skip
def test_a_sequence_degree_the_run_cannot_take_is_refused_before_anything_is_launched(
    profile, refusal, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(subprocess, "Popen", refuse_to_launch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--profile", profile, "--model", "gpt2", "--sequence_parallel", "2",
                  "--output_dir", str(tmp_path / "out")])  # fmt: skip
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: error:")]
    assert len(errors) == 1 and refusal in errors[0]


def test_ulysses_under_a_zero3_json_that_reduces_split_gradients_unevenly_is_refused(
    tmp_path, monkeypatch, capsys
):
    """reduce_scatter false with contiguous_gradients: split and unsplit weights then differ 1,000 times
    more than with DeepSpeed's defaults (benchmarks/cpu-2026-12-03-ranges/NOTES.md)."""
    profile, deepspeed_json = copy_profile("zero3", tmp_path / "mine")
    settings = json.loads(deepspeed_json.read_text())
    settings["zero_optimization"]["reduce_scatter"] = False
    deepspeed_json.write_text(json.dumps(settings))
    monkeypatch.setattr(subprocess, "Popen", refuse_to_launch)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--profile", str(profile), "--num_processes", "2", "--model", "gpt2",
                  "--sequence_parallel", "2", "--output_dir", str(tmp_path / "out")])  # fmt: skip
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: error:")]
    assert len(errors) == 1 and "sets reduce_scatter false with contiguous_gradients" in errors[0]


@pytest.mark.parametrize(
    ("profile", "nvme_flags", "refusal"),
    [("zero3_nvme", [], "zero3_nvme.json offloads to NVMe: pass --nvme_path DIR"),
     ("ddp", ["--nvme_path", "swap"], "--nvme_path is only used with an NVMe-offload profile")],
    ids=["NVMe offload without a folder", "a folder without NVMe offload"],
)  # fmt: skip
def test_an_nvme_path_the_profile_cannot_take_is_refused_before_anything_is_launched(
    profile, nvme_flags, refusal, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(subprocess, "Popen", refuse_to_launch)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--profile", profile, "--model", "gpt2", *nvme_flags, "--output_dir", str(tmp_path)])
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: error:")]
    assert len(errors) == 1 and refusal in errors[0]
    assert not (tmp_path / "swap").exists()


def test_an_optimizer_the_profiles_deepspeed_json_would_ignore_is_refused_before_anything_is_launched(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(subprocess, "Popen", refuse_to_launch)
    with pytest.raises(SystemExit) as stopped:
        cli.main(
            [
                "run",
                "--profile",
                "zero3_offload",
                "--model",
                "gpt2",
                "--optim",
                "sgd",
                "--output_dir",
                str(tmp_path),
            ]
        )
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: error:")]
    assert len(errors) == 1 and "zero3_offload.json sets DeepSpeed's own optimizer (AdamW)" in errors[0]


@pytest.mark.parametrize("model_flags", [["--model", "gpt2-medium"], ["recipe.yaml"]], ids=["flag", "recipe"])
def test_compare_runs_the_model_of_the_model_flag_or_of_the_recipe(model_flags, tmp_path, monkeypatch):
    write_recipe(tmp_path, "model: gpt2-medium\n")
    given = []

    def compare(profiles, placement, run_args, output_dir, timeout, command_line, json_flags):
        given.append(run_args)
        output_dir.mkdir(parents=True)
        (output_dir / "comparison.md").write_text("| profile |\n")
        return [Row(profile="ddp", status="completed")]

    monkeypatch.setattr(finetune.compare, "compare", compare)
    argv = ["compare", "--profiles", "ddp", "--output_dir", str(tmp_path / "compared"), *model_flags]
    assert cli.main(argv) == 0
    model_args, _, _ = parse_arguments(given[0])
    assert model_args.model == "gpt2-medium"


def slurm_script(tmp_path: Path, *arguments: str) -> str:
    script = tmp_path / "job.sbatch"
    command = ["slurm", "--profile", "ddp", "--gpus_per_node", "1", "--output", str(script), *arguments]
    assert cli.main(command) == 0
    return script.read_text()


def test_slurm_job_writes_into_the_output_dir_of_its_recipe(tmp_path):
    recipe = write_recipe(tmp_path, f"model: gpt2\noutput_dir: {tmp_path / 'from-recipe'}\n")
    text = slurm_script(tmp_path, str(recipe))
    assert f"--output_dir {tmp_path / 'from-recipe'} --resume)" in text


def test_slurm_job_without_an_output_dir_writes_into_outputs_job_name(tmp_path):
    text = slurm_script(tmp_path, "--job_name", "tiny", "--", "--model", "gpt2")
    assert f"--model gpt2 --output_dir {tmp_path / 'outputs' / 'tiny'} --resume)" in text


def test_eval_completions_go_beside_the_output_else_into_the_evaluated_models_folder(tmp_path):
    assert evaluate_command.completions_path(str(tmp_path / "r.json"), str(tmp_path), "test") == str(
        tmp_path / "r.completions.jsonl"
    )
    assert evaluate_command.completions_path(None, str(tmp_path), "test") == str(
        tmp_path / "eval-test.completions.jsonl"
    )
    assert (
        evaluate_command.completions_path(None, "gpt2-not-a-folder", "validation")
        == "eval-validation.completions.jsonl"
    )
