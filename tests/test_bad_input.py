"""Bad input stops before training with one `finetune: error:` line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from finetune import cli, run

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NVME_CONFIG = str(PROJECT_ROOT / "ds_configs" / "zero3_nvme.json")
TINY_MODEL = "n_layer=1,n_embd=32,n_head=2"
TINY_FROM_SCRATCH = ["--model", "gpt2", "--from_scratch", "--config_overrides", TINY_MODEL]


def error_lines(argv: list[str], capsys, entry=run.main) -> list[str]:
    with pytest.raises(SystemExit) as stopped:
        entry(argv)
    assert stopped.value.code == 2
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("finetune: error:")]


def assert_one_error(argv, capsys, expected: str, entry=run.main) -> None:
    lines = error_lines(argv, capsys, entry)
    assert len(lines) == 1, lines
    assert expected in lines[0]


def test_unknown_model_names_what_was_looked_for(output_flags, capsys):
    assert_one_error(["--model", "no-such-model", *output_flags], capsys, "looked in")


def test_model_without_weights_asks_for_from_scratch(output_flags, capsys):
    assert_one_error(["--model", "gpt2-medium", *output_flags], capsys, "--from_scratch")


def test_unknown_dataset_is_one_line(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--dataset", "no-such-dataset", *output_flags]
    assert_one_error(argv, capsys, "dataset 'no-such-dataset' not found")


def test_missing_text_column_lists_the_columns(output_flags, make_jsonl_file, capsys):
    path = make_jsonl_file("docs.jsonl", [{"content": "some text"}] * 20)
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), "--text_column", "body", *output_flags]
    assert_one_error(argv, capsys, "columns: content")


def test_empty_dataset_is_rejected(output_flags, make_text_file, capsys):
    path = make_text_file("empty.txt", "")
    assert_one_error([*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags], capsys, "empty data file")


def test_block_size_beyond_the_context_is_rejected(output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, "--block_size", "2048", *output_flags], capsys, "context of 1024")


def test_zero_batch_size_is_rejected(output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, "--batch_size", "0", *output_flags], capsys, "--batch_size")


def test_unknown_recipe_key_is_named(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: gpt2\nlearning_rat: 0.001\n")
    assert_one_error([str(recipe)], capsys, "learning_rat")


def test_unknown_flag_is_named(output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, "--learning_rat", "1", *output_flags], capsys, "--learning_rat")


def test_nvme_profile_without_a_folder_asks_for_nvme_path(output_flags, monkeypatch, capsys):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", NVME_CONFIG)
    assert_one_error([*TINY_FROM_SCRATCH, *output_flags], capsys, "--nvme_path")


def test_nvme_path_without_an_nvme_profile_is_rejected(output_flags, tmp_path, capsys):
    argv = [*TINY_FROM_SCRATCH, "--nvme_path", str(tmp_path / "nvme"), *output_flags]
    assert_one_error(argv, capsys, "only used with an NVMe-offload profile")


def test_unknown_profile_lists_the_available_ones(capsys):
    assert_one_error(["run", "--profile", "zero4"], capsys, "available: ddp", entry=cli.main)


def test_plan_of_a_profile_the_planner_does_not_know_names_those_it_does(capsys):
    argv = ["plan", "--model", "gpt2", "--gpu_memory", "80", "--profiles", "ddp,single"]
    assert_one_error(argv, capsys, "cannot plan profile single: the planner knows ddp, zero1", entry=cli.main)


def test_nvme_path_is_filled_into_the_deepspeed_config(output_flags, monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", NVME_CONFIG)
    from finetune.arguments import parse_arguments

    _, _, training_args = parse_arguments(["--nvme_path", str(tmp_path / "nvme"), *output_flags])
    zero = training_args.deepspeed["zero_optimization"]
    nvme = str(tmp_path / "nvme")
    assert zero["offload_param"]["nvme_path"] == zero["offload_optimizer"]["nvme_path"] == nvme
    assert json.dumps(training_args.deepspeed).count('"auto"') > 0  # the Trainer's own autos are kept


def test_script_exits_2_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "finetune" / "run.py"), "--model", "no-such-model"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("finetune: error: model 'no-such-model' not found")
