"""Bad input stops before training with one `finetune: error:` line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from finetune import cli, run
from finetune.arguments import parse_arguments
from finetune.profiles import copy_profile
from finetune.summary import RunRecord, read_summary

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, accelerate_launch

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


def test_a_global_batch_larger_than_the_training_set_is_refused_once_its_size_is_known(
    output_flags, make_text_file, capsys
):
    path = make_text_file("short.txt", "a short line of text for a tiny training set\n" * 400)
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), "--block_size", "32", "--batch_size", "4",
            "--gradient_accumulation_steps", "100", *output_flags]  # fmt: skip
    assert_one_error(
        argv, capsys, "the global batch 400 = micro batch 4 x accumulation 100 x 1 process is larger"
    )


def test_a_dataset_config_for_a_local_dataset_is_refused_not_ignored(output_flags, make_text_file, capsys):
    path = make_text_file("local.txt", "some text\n" * 50)
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), "--dataset_config", "en", *output_flags]
    assert_one_error(argv, capsys, f"--dataset_config en: {path} is a local dataset")


def test_data_file_of_unknown_type_names_the_known_suffixes(output_flags, make_text_file, capsys):
    path = make_text_file("passwd", "root:x:0:0:root:/root:/bin/bash\n" * 20)
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, "cannot tell its format from the suffix '(none)'; name it as one of .txt")


def test_block_size_beyond_the_context_is_rejected(output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, "--block_size", "2048", *output_flags], capsys, "context of 1024")


def test_zero_batch_size_is_rejected(output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, "--batch_size", "0", *output_flags], capsys, "--batch_size")


def test_unknown_recipe_key_is_named(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: gpt2\nlearning_rat: 0.001\n")
    assert_one_error([str(recipe)], capsys, "learning_rat")


def test_recipe_key_given_twice_is_one_line_naming_both_lines(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: gpt2\nlearning_rate: 0.001\nmodel: gpt2-medium\n")
    assert_one_error(
        [str(recipe)], capsys, "recipe.yaml line 3: not valid YAML ('model' is given twice (first on line 1))"
    )


def test_recipe_that_is_not_yaml_is_one_line_naming_its_line(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: gpt2\nlearning_rate: [1\n")
    assert_one_error([str(recipe)], capsys, "recipe.yaml line 3: not valid YAML")


def test_recipe_given_after_the_flags_is_told_to_come_first(tmp_path, output_flags, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: gpt2\n")
    argv = [*TINY_FROM_SCRATCH, *output_flags, str(recipe)]
    assert_one_error(argv, capsys, f"a recipe comes before the flags: {recipe} was given after them")


def test_text_column_of_numbers_is_refused_as_not_text(output_flags, make_jsonl_file, capsys):
    path = make_jsonl_file("numbers.jsonl", [{"text": number} for number in range(20)])
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, "--text_column 'text' holds int64 values, not text")


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_numpy_cannot_take_is_refused_before_the_model_is_built(seed, output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--seed", seed, *output_flags]
    assert_one_error(argv, capsys, f"--seed must be between 0 and 4294967295, got {seed}")


def test_unknown_flag_is_named_with_where_the_flags_are_listed(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--no_such_flag", "1", *output_flags]
    assert_one_error(argv, capsys, "unrecognized arguments: --no_such_flag 1 (`finetune/run.py --help` lists")


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [("--weight_decay", "-0.1", "--weight_decay must be 0 or more"),
     ("--adam_beta1", "1.5", "--adam_beta1 must be at least 0 and below 1"),
     ("--adam_beta2", "-0.1", "--adam_beta2 must be at least 0 and below 1"),
     ("--adam_epsilon", "-1e-8", "--adam_epsilon must be 0 or more"),
     ("--warmup_steps", "-3", "--warmup_steps must be 0 or more")],
)  # fmt: skip
def test_optimizer_settings_adamw_refuses_or_misuses_are_refused(flag, value, expected, output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, f"{flag}={value}", *output_flags], capsys, expected)


@pytest.mark.parametrize(
    ("flag", "expected"),
    [("--logging_steps=-1", "--logging_steps must be 0 or more (below 1: a fraction of the steps)"),
     ("--save_steps=-2", "--save_steps must be 0 or more (below 1: a fraction of the steps)"),
     ("--dataloader_num_workers=-1", "--dataloader_num_workers must be 0 or more (0: load in the training"),
     ("--preprocessing_num_workers=-1", "--preprocessing_num_workers must be 0 or more"),
     ("--watchdog_s=-1", "--watchdog_s must be 0 or more (0: off)")],
)  # fmt: skip
def test_a_negative_interval_or_worker_count_is_refused(flag, expected, output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, flag, *output_flags], capsys, expected)


@pytest.mark.parametrize("flag", ["--max_grad_norm", "--weight_decay", "--lora_alpha"])
def test_a_float_flag_given_as_nan_is_refused_though_every_range_check_passes_it(flag, output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, flag, "nan", *output_flags]
    assert_one_error(argv, capsys, f"{flag} is nan: give a finite number")


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--warmup_steps", "inf"), ("--logging_steps", "inf"), ("--weight_decay", "inf"),
     ("--loss_spike_factor", "-inf")],
)  # fmt: skip
def test_a_float_flag_given_as_infinity_is_refused_before_the_trainer_counts_steps_with_it(
    flag, value, output_flags, capsys
):
    argv = [*TINY_FROM_SCRATCH, f"{flag}={value}", *output_flags]
    assert_one_error(argv, capsys, f"{flag} is {float(value)}: give a finite number")


@pytest.mark.parametrize("report_to", ["bogus", "tensorboard,bogus"])
def test_a_report_to_transformers_does_not_know_is_refused_before_the_model(report_to, output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, *output_flags, "--report_to", report_to]
    assert_one_error(argv, capsys, "--report_to bogus: not an integration transformers knows (none, all, ")


def test_a_report_to_whose_package_is_missing_is_refused_before_the_model(output_flags, monkeypatch, capsys):
    import transformers.integrations

    monkeypatch.setattr(transformers.integrations, "get_available_reporting_integrations", lambda: [])
    argv = [*TINY_FROM_SCRATCH, *output_flags, "--report_to", "wandb"]
    assert_one_error(argv, capsys, "--report_to wandb: its package is not installed here")


def test_report_to_takes_a_comma_separated_list_as_a_recipes_list_becomes(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: gpt2\nreport_to: [tensorboard, tensorboard]\n")
    _, _, training_args = parse_arguments([str(recipe)])
    assert training_args.report_to == ["tensorboard"]  # once: one callback per integration


@pytest.mark.parametrize(
    ("flag", "expected"),
    [("--lr_scheduler_type", "argument --lr_scheduler_type/--lr-scheduler-type: invalid choice: 'bogus'"),
     ("--torch_compile_mode", "--torch_compile_mode bogus: torch knows default, ")],
)  # fmt: skip
def test_an_unknown_schedule_or_compile_mode_is_refused_early(flag, expected, output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, *output_flags, flag, "bogus"], capsys, expected)


def test_a_misspelt_flag_is_answered_with_the_closest_one(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--learning_rat", "1", *output_flags]
    assert_one_error(argv, capsys, "did you mean --learning_rate?")


@pytest.mark.parametrize(
    ("flag", "named_here"),
    [("--warmup_ratio", "use --warmup_steps"), ("--max_seq_length", "use --block_size"),
     ("--dataset_config_name", "use --dataset_config"), ("--lora_r", "use --lora_rank")],
)  # fmt: skip
def test_a_flag_of_another_tool_is_answered_with_its_name_here(flag, named_here, output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, f"{flag}=1", *output_flags]
    assert_one_error(argv, capsys, f"for {flag} {named_here}")


def test_a_recipe_key_of_another_tool_is_answered_with_its_name_here(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: gpt2\nmax_seq_length: 128\n")
    expected = "unknown key(s) max_seq_length; for --max_seq_length use --block_size"
    assert_one_error([str(recipe)], capsys, expected)


def test_an_unknown_run_flag_given_to_a_command_points_at_the_run_flags_help(capsys):
    argv = ["plan", "--model", "gpt2", "--gpu_memory", "80", "--no_such_flag", "8"]
    expected = "unrecognized arguments: --no_such_flag 8 (`finetune/run.py --help`"
    assert_one_error(argv, capsys, expected, entry=cli.main)


def test_an_optimizer_whose_package_is_missing_is_refused_before_the_model(output_flags, monkeypatch, capsys):
    from transformers import trainer_optimizer

    monkeypatch.setattr(trainer_optimizer, "is_bitsandbytes_available", lambda: False)
    argv = [*TINY_FROM_SCRATCH, "--optim", "adamw_bnb_8bit", *output_flags]
    assert_one_error(argv, capsys, "--optim adamw_bnb_8bit: You need to install `bitsandbytes`")


def test_optim_args_that_are_not_key_value_pairs_are_one_line(output_flags, capsys):
    argv = [
        *TINY_FROM_SCRATCH,
        "--optim",
        "adafactor",
        "--optim_args",
        "scale_parameter=false,warmup",
        *output_flags,
    ]
    assert_one_error(argv, capsys, "--optim_args: 'warmup' is not key=value")


def test_optim_flags_a_deepspeed_json_with_its_own_optimizer_would_ignore_are_refused(
    output_flags, monkeypatch, capsys
):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv(
        "ACCELERATE_DEEPSPEED_CONFIG_FILE", str(PROJECT_ROOT / "ds_configs" / "zero2_offload.json")
    )
    argv = [*TINY_FROM_SCRATCH, "--optim", "sgd", *output_flags]
    assert_one_error(argv, capsys, "--optim sgd: ")
    argv = [*TINY_FROM_SCRATCH, "--optim_args", "foreach=false", *output_flags]
    assert_one_error(argv, capsys, "--optim_args: ")
    assert_one_error(argv, capsys, "zero2_offload.json sets DeepSpeed's own optimizer (AdamW)")


def test_label_smoothing_which_would_change_the_reported_loss_is_refused(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--label_smoothing_factor", "0.1", *output_flags]
    assert_one_error(argv, capsys, "--label_smoothing_factor: finetune trains on and reports the model's own")


def test_a_best_model_metric_the_evaluation_does_not_report_is_refused_before_training(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--metric_for_best_model", "accuracy", *output_flags]
    assert_one_error(
        argv, capsys, "--metric_for_best_model accuracy: the evaluation reports loss, token_loss, perplexity"
    )


@pytest.mark.parametrize("metric", ["perplexity", "eval_perplexity", "token_loss", "loss"])
def test_the_best_model_is_the_one_of_lowest_loss_or_perplexity(metric):
    """transformers' default would call perplexity greater-is-better and keep the worst checkpoint."""
    _, _, training_args = parse_arguments([*TINY_FROM_SCRATCH, "--metric_for_best_model", metric])
    assert training_args.greater_is_better is False


def test_save_strategy_best_keeps_the_checkpoint_of_lowest_evaluation_loss_by_default():
    flags = ["--save_strategy", "best", "--eval_strategy", "steps", "--eval_steps", "5"]
    _, _, training_args = parse_arguments([*TINY_FROM_SCRATCH, *flags])
    assert (training_args.metric_for_best_model, training_args.greater_is_better) == ("loss", False)


def test_save_strategy_best_without_an_evaluation_during_training_is_refused(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--save_strategy", "best", *output_flags]  # no checkpoint would be saved
    assert_one_error(argv, capsys, "--save_strategy best saves when an evaluation finds a better model")


def test_a_transformers_flag_check_keeps_the_facts_below_its_first_line(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--load_best_model_at_end", *output_flags]
    assert_one_error(
        argv, capsys, 'strategy to match, except when --save_strategy="best", but found - Evaluation'
    )


def test_greater_is_better_for_a_loss_or_perplexity_is_refused(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--metric_for_best_model", "perplexity", "--greater_is_better", "true",
            *output_flags]  # fmt: skip
    assert_one_error(argv, capsys, "--greater_is_better: a lower perplexity is the better model")


def test_auto_find_batch_size_which_would_change_the_global_batch_points_at_the_planner(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--auto_find_batch_size", *output_flags]
    assert_one_error(argv, capsys, "--auto_find_batch_size would shrink the micro batch")


@pytest.mark.parametrize(
    ("flag", "value"), [("--fsdp", "full_shard"), ("--fsdp_config", '{"min_num_params": 1}')]
)
def test_trainer_fsdp_flags_beside_the_profiles_fsdp_point_at_the_fsdp_profiles(
    flag, value, output_flags, capsys
):
    assert_one_error(
        [*TINY_FROM_SCRATCH, flag, value, *output_flags], capsys, f"{flag}: FSDP comes from the profile"
    )


def test_push_to_hub_offline_is_refused_before_the_trainer_tries(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--push_to_hub", *output_flags]
    assert_one_error(argv, capsys, "--push_to_hub needs the Hugging Face Hub, and HF_HUB_OFFLINE is set")


def test_a_tokenizer_not_found_is_called_a_tokenizer(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--tokenizer", "/no/such/tokenizer", *output_flags]
    assert_one_error(argv, capsys, "tokenizer '/no/such/tokenizer' not found; looked in: local path")


def test_a_model_folder_without_tokenizer_files_is_refused_not_given_an_empty_tokenizer(
    tiny_gpt2_dir, tmp_path, output_flags, capsys
):
    bare = tmp_path / "weights-only"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((tiny_gpt2_dir / name).read_bytes())
    assert_one_error(["--model", str(bare), *output_flags], capsys, f"no tokenizer in {bare}: its files")
    assert_one_error(["generate", str(bare), "--prompt", "hi"], capsys, "no tokenizer in", entry=cli.main)


def test_export_of_a_model_folder_says_it_already_is_one(tiny_gpt2_dir, tmp_path, capsys):
    argv = ["export", str(tiny_gpt2_dir), str(tmp_path / "exported")]
    assert_one_error(argv, capsys, f"{tiny_gpt2_dir} is a model folder, not a checkpoint", entry=cli.main)


def test_nvme_profile_without_a_folder_asks_for_nvme_path(output_flags, monkeypatch, capsys):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", NVME_CONFIG)
    assert_one_error([*TINY_FROM_SCRATCH, *output_flags], capsys, "--nvme_path")


def test_nvme_path_without_an_nvme_profile_is_rejected(output_flags, tmp_path, capsys):
    argv = [*TINY_FROM_SCRATCH, "--nvme_path", str(tmp_path / "nvme"), *output_flags]
    assert_one_error(argv, capsys, "only used with an NVMe-offload profile")


def test_unknown_profile_lists_the_available_ones(capsys):
    assert_one_error(["run", "--profile", "zero4"], capsys, "available: ddp", entry=cli.main)


@pytest.mark.parametrize(
    ("placement", "expected"),
    [(["ddp", "--num_processes", "0"], "--num_processes must be at least 1, got 0"),
     (["ddp", "--num_processes", "2", "--num_machines", "0"], "--num_machines must be at least 1"),
     (["ddp", "--num_processes", "2", "--main_process_port", "99999"], "--main_process_port must be from 0"),
     (["ddp", "--num_processes", "4", "--num_machines", "2", "--machine_rank", "2"],
      "--machine_rank 2: must be from 0 to 1 of 2 machine(s)"),
     (["ddp", "--num_processes", "3", "--num_machines", "2"], "--num_processes 3 is not a multiple of the 2"),
     (["single", "--num_processes", "2"], "--num_processes 2: profile single runs one process")],
)  # fmt: skip
def test_a_placement_accelerate_would_fail_on_or_ignore_is_one_line(placement, expected, tmp_path, capsys):
    argv = ["run", "--profile", *placement, *TINY_FROM_SCRATCH, "--output_dir", str(tmp_path / "run")]
    assert_one_error(argv, capsys, expected, entry=cli.main)


def test_plan_of_an_unknown_profile_lists_the_available_ones(capsys):
    argv = ["plan", "--model", "gpt2", "--gpu_memory", "80", "--profiles", "ddp,zero4"]
    assert_one_error(argv, capsys, "unknown profile 'zero4' (available: ddp", entry=cli.main)


def test_finetune_without_a_command_lists_the_commands(capsys):
    assert_one_error([], capsys, "name a command: profiles, run, compare, slurm, doctor", entry=cli.main)


def test_a_deepspeed_json_given_as_the_profile_says_where_a_json_goes(tmp_path, capsys):
    """It was called an unknown profile, beside the list of names."""
    argv = ["run", "--profile", "ds_configs/zero3.json", *TINY_FROM_SCRATCH, "--output_dir", str(tmp_path)]
    assert_one_error(argv, capsys, "a DeepSpeed JSON is named by a profile's", entry=cli.main)


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_model_given_as_a_flag_to_a_command_that_takes_it_first_says_so(command, capsys):
    argv = [command, "--model", "outputs/run"]
    assert_one_error(
        argv,
        capsys,
        f"takes the model as its first argument, not --model: finetune {command} MODEL",
        entry=cli.main,
    )


def test_an_unknown_flag_of_a_command_points_at_that_commands_help(capsys):
    argv = ["export", "outputs/run/checkpoint-2", "exported", "--output", "x"]
    assert_one_error(
        argv, capsys, "unrecognized arguments: --output x (`finetune export --help`", entry=cli.main
    )


@pytest.mark.parametrize(
    ("flag", "given", "expected"),
    [("--profiles", "", "--profiles is empty"),
     ("--profiles", "ddp,zero3,ddp", "ddp given more than once"),
     ("--variants", " , ", "--variants is empty"),
     ("--variants", "full,lora,full", "full given more than once")],
)  # fmt: skip
def test_compare_refuses_an_empty_or_repeated_name(flag, given, expected, capsys):
    argv = ["compare", "--num_processes", "2", flag, given, *TINY_FROM_SCRATCH]
    assert_one_error(argv, capsys, expected, entry=cli.main)


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


# Values TrainingArguments accepts and the run misuses: refused while the arguments are parsed


@pytest.mark.parametrize("steps", ["-3", "0"])
def test_max_steps_that_is_neither_positive_nor_minus_one_is_rejected(steps, output_flags, capsys):
    assert_one_error([*TINY_FROM_SCRATCH, "--max_steps", steps, *output_flags], capsys, "--max_steps")


@pytest.mark.parametrize("epochs", ["0", "-1", "nan"])
def test_epochs_that_are_not_a_positive_number_are_rejected(epochs, output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--max_steps", "-1", "--epochs", epochs, *output_flags]
    assert_one_error(argv, capsys, "--epochs must be a positive number")


def test_epochs_are_not_checked_where_max_steps_decides(output_flags):
    training = parse_arguments([*TINY_FROM_SCRATCH, "--max_steps", "3", "--epochs", "0", *output_flags])[2]
    assert training.max_steps == 3


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_save_total_limit_below_one_is_rejected(limit, output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--save_total_limit", limit, *output_flags]
    assert_one_error(argv, capsys, "--save_total_limit must be at least 1")


@pytest.mark.parametrize("rate", ["nan", "inf", "0", "-0.001"])
def test_learning_rate_that_is_not_a_positive_number_is_rejected(rate, output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--learning_rate", rate, *output_flags]
    assert_one_error(argv, capsys, "--learning_rate must be a positive number")


def test_output_dir_that_is_a_file_is_rejected(make_text_file, capsys):
    path = make_text_file("taken", "a file")
    argv = [*TINY_FROM_SCRATCH, "--output_dir", str(path), "--report_to", "none"]
    assert_one_error(argv, capsys, f"--output_dir {path} is a file")


def test_nvme_path_that_is_a_file_is_rejected(output_flags, make_text_file, monkeypatch, capsys):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", NVME_CONFIG)
    path = make_text_file("nvme", "a file")
    argv = [*TINY_FROM_SCRATCH, "--nvme_path", str(path), *output_flags]
    assert_one_error(argv, capsys, f"--nvme_path {path} is a file")


@pytest.mark.parametrize("name", ["../escaped", "runs/inner", "..", "back\\slash"])
def test_run_name_that_is_not_one_folder_name_is_rejected(name, output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--run_name", name, *output_flags]
    assert_one_error(argv, capsys, "a run name is one folder name")


def test_run_name_longer_than_255_bytes_is_rejected(output_flags, capsys):
    argv = [*TINY_FROM_SCRATCH, "--run_name", "r" * 300, *output_flags]
    assert_one_error(argv, capsys, "at most 255 bytes, got 300")


def test_run_name_from_a_checkpoint_manifest_is_checked(tmp_path, capsys):
    from finetune.checkpoint import write_manifest

    checkpoint = tmp_path / "out" / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    write_manifest(checkpoint, 1, "../../escaped")  # an intact checkpoint but for its run name
    argv = [*TINY_FROM_SCRATCH, "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--resume"]
    assert_one_error(argv, capsys, "run_name in")


def test_deepspeed_stage_4_under_a_bare_launch_is_rejected(output_flags, tmp_path, monkeypatch, capsys):
    config = json.loads((PROJECT_ROOT / "ds_configs" / "zero2.json").read_text())
    config["zero_optimization"]["stage"] = 4
    (tmp_path / "zero4.json").write_text(json.dumps(config))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(tmp_path / "zero4.json"))
    assert_one_error(
        [*TINY_FROM_SCRATCH, *output_flags], capsys, "zero_optimization.stage: must be 0, 1, 2 or 3"
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max_new_tokens", "-5"),
        ("--max_new_tokens", "0"),
        ("--temperature", "0"),
        ("--temperature", "-1"),
        ("--temperature", "inf"),
        ("--top_p", "0"),
        ("--top_p", "1.5"),
        ("--top_k", "-1"),
        ("--seed", "-1"),
        ("--seed", str(2**32)),
    ],
)
def test_generate_rejects_sampling_settings_out_of_range(flag, value, capsys):
    argv = ["generate", "no-model-is-loaded", "--prompt", "Hello", flag, value]
    assert_one_error(argv, capsys, f"{flag} must be", entry=cli.main)


@pytest.mark.parametrize(
    "command",
    [["generate", "no-model-is-loaded", "--prompt", "Hello"], ["eval", "no-model-is-loaded", "--generate"]],
    ids=["generate", "eval --generate"],
)
def test_an_empty_stop_text_is_refused_before_the_model_is_loaded(command, capsys):
    """It ended every completion at once: a ValueError traceback after generating."""
    assert_one_error(
        [*command, "--stop", "Question:", "--stop", ""], capsys, "--stop '' is empty", entry=cli.main
    )


def test_generate_from_a_prompt_that_fills_the_context_is_refused_before_the_model_is_loaded(
    tiny_gpt2_dir, capsys
):
    argv = ["generate", str(tiny_gpt2_dir), "--prompt", " ".join(["Hello"] * 128), "--max_new_tokens", "1"]
    expected = "a prompt of 128 tokens fills the model's context of 128 tokens (its config's n_positions)"
    assert_one_error(argv, capsys, expected, entry=cli.main)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--block_size", "1"),
        ("--block_size", "0"),
        ("--stride", "0"),
        ("--stride", "-1"),
        ("--stride", "129"),
        ("--batch_size", "0"),
        ("--max_tokens", "0"),
    ],
)
def test_eval_rejects_window_settings_out_of_range(flag, value, tiny_gpt2_dir, capsys):
    argv = ["eval", str(tiny_gpt2_dir), "--block_size", "128", flag, value]
    assert_one_error(argv, capsys, f"{flag} must be", entry=cli.main)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [(["--output", "{tmp}"], "--output {tmp} is a folder: give a file name"),
     (["--output", "{tmp}/a_file/result.json"], "{tmp}/a_file is a file, not a folder"),
     (["--generate", "--completions", "{tmp}"], "--completions {tmp} is a folder: give a file name"),
     (["--output", "{model}/config.json"], "--output {model}/config.json is a file of the evaluated model"),
     (["--generate", "--completions", "{model}/model.safetensors"], "is a file of the evaluated model"),
     (["--output", "{tmp}/r.json", "--generate", "--completions", "{tmp}/r.json"], "both name {tmp}/r.json")],
)  # fmt: skip
def test_eval_refuses_a_result_file_it_could_not_write_before_evaluating(
    flags, expected, tiny_gpt2_dir, tmp_path, capsys
):
    (tmp_path / "a_file").write_text("kept")
    given = [flag.format(tmp=tmp_path, model=tiny_gpt2_dir) for flag in flags]
    argv = ["eval", str(tiny_gpt2_dir), "--dataset", "no-such-dataset", *given]  # refused before the data
    assert_one_error(argv, capsys, expected.format(tmp=tmp_path, model=tiny_gpt2_dir), entry=cli.main)


def test_eval_refuses_a_completions_file_without_generate_which_would_not_write_it(capsys):
    argv = ["eval", "no-model-is-loaded", "--completions", "answers.jsonl"]
    assert_one_error(argv, capsys, "--completions holds generated answers: add --generate", entry=cli.main)


@pytest.mark.parametrize(
    ("given", "named"), [(["--generate"], "--generate"), (["--max_examples", "2"], "--max_examples")]
)
def test_eval_of_answers_on_plain_text_names_the_flag_given(
    given, named, tiny_gpt2_dir, make_text_file, capsys
):
    text = make_text_file("plain.txt", "words and more words\n" * 40)
    argv = ["eval", str(tiny_gpt2_dir), "--dataset", str(text), *given]
    assert_one_error(
        argv, capsys, f"{named} needs prompts and answers; dataset '{text}' is plain text", entry=cli.main
    )


def test_eval_makes_the_missing_folders_of_its_result_file(tiny_gpt2_dir, tmp_path, capsys):
    result = tmp_path / "new" / "folder" / "result.json"
    argv = ["eval", str(tiny_gpt2_dir), "--block_size", "32", "--max_tokens", "64", "--output", str(result)]
    assert cli.main(argv) == 0
    assert json.loads(result.read_text())["tokens"] > 0


# Data files that cannot be decoded: the file and the line, before the model is built


def test_a_null_text_names_its_line(output_flags, make_jsonl_file, capsys):
    """An instruction row's null prompt or answer is an empty one; a plain text has no such reading."""
    path = make_jsonl_file("nulls.jsonl", [{"text": "some text"}, {"text": None}] * 10)
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path} line 2: its 'text' is empty (null), not text")


def test_recipe_with_a_list_as_a_key_is_one_line_naming_its_line(tmp_path, capsys):
    """The duplicate-key check passes an unhashable key on to YAML's own refusal."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: gpt2\n[a, b]: 1\n")
    assert_one_error([str(recipe)], capsys, "recipe.yaml line 2: not valid YAML (found unhashable key)")


def test_a_number_among_texts_names_its_line(output_flags, make_jsonl_file, capsys):
    """JSON lines that mix texts and a number make datasets' Json column, which has no one type to name."""
    rows = [{"text": "some text"}] * 3 + [{"text": 5}] + [{"text": "more text"}] * 9
    path = make_jsonl_file("mixed.jsonl", rows)
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path} line 4: its 'text' is 5 (a number), not text")


def test_binary_data_file_names_the_file(output_flags, tmp_path, capsys):
    path = tmp_path / "weights.txt"
    path.write_bytes(b"some text\n" + bytes(range(256)) * 4)
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path} line 2: a binary file")


def test_non_utf8_text_file_names_the_line(output_flags, tmp_path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes("first line\nsecond line\ncaf\u00e9 au lait\n".encode("latin-1"))
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path} line 3: not UTF-8 text")


def test_bad_jsonl_line_is_named(output_flags, make_text_file, capsys):
    path = make_text_file("data.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": "c",}\n{"text": "d"}\n')
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path} line 3: not valid JSON (")


def test_a_json_object_holding_its_rows_under_one_key_says_how_to_lay_them_out(
    output_flags, make_text_file, capsys
):
    path = make_text_file("squad.json", json.dumps({"data": [{"text": "hello world " * 30}] * 40}, indent=1))
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path}: one JSON object holding its rows under 'data': give the rows as")


def test_a_one_line_conversation_is_a_row_not_rows_under_a_key():
    from finetune.local_data import rows_under_one_key

    conversation = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    }
    assert rows_under_one_key(json.dumps(conversation)) is None
    assert rows_under_one_key(json.dumps({"conversations": [{"from": "human", "value": "hi"}]})) is None
    assert rows_under_one_key(json.dumps({"rows": [{"text": "a"}, {"text": "b"}]})) == "rows"


def test_csv_that_does_not_parse_names_the_line(output_flags, make_text_file, capsys):
    path = make_text_file("data.csv", 'text,label\n"a",1\n"b",2,3\n"c",4\n')
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path} line 3: not valid CSV")


def test_a_damaged_parquet_file_is_named(output_flags, tmp_path, capsys):
    path = tmp_path / "data.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path}: not a readable Parquet file (")


def test_a_parquet_file_with_damaged_data_is_not_called_a_binary_text_file(output_flags, tmp_path, capsys):
    """Its footer reads, its pages do not: the builder's own error, not the text checks' "binary"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": f"line {i} " * 20} for i in range(200)]), path)
    damaged = bytearray(path.read_bytes())
    damaged[100 : len(damaged) // 2] = b"\xab" * (len(damaged) // 2 - 100)
    path.write_bytes(bytes(damaged))
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags]
    assert_one_error(argv, capsys, f"{path}: cannot read as parquet data (")


def test_ctrl_c_that_a_library_replaces_with_its_own_error_is_recorded_as_interrupted(tmp_path):
    """datasets' multi-process map (tokenization) answers Ctrl-C with a TimeoutError from its clean-up."""
    record = RunRecord(str(tmp_path), "run", is_main_process=True)
    with pytest.raises(KeyboardInterrupt), record.until_exit():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise TimeoutError()  # noqa: B904 - as datasets raises it: the Ctrl-C only as its context
    summary = read_summary(tmp_path)
    assert (summary["status"], summary["error"]) == ("interrupted", "interrupted by SIGINT")


# Through the launchers: each user error once, from rank 0 or from `finetune run`


def launched(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    flags = ["--model", "no-such-model", "--output_dir", str(tmp_path / "out"), "--report_to", "none"]
    return subprocess.run(
        [*command, *flags],
        cwd=PROJECT_ROOT,
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )


@pytest.mark.integration
def test_finetune_run_reports_a_rank_error_once_with_exit_2(tmp_path):
    command = [sys.executable, "-m", "finetune", "run", "--profile", "ddp", "--num_processes", "2"]
    result = launched(command, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("finetune: error:")]
    assert lines == [lines[0]] and "model 'no-such-model' not found" in lines[0], result.stderr[-3000:]


def run_copied_profile(
    tmp_path: Path, name: str, edit: Callable[[str], str]
) -> subprocess.CompletedProcess[str]:
    """`finetune run` of a copy of a shipped profile whose file `edit` changed: its JSON where it has
    one, else its YAML."""
    copies = copy_profile(name, tmp_path / "profiles")
    edited = copies[-1]
    edited.write_text(edit(edited.read_text()))
    command = [sys.executable, "-m", "finetune", "run", "--profile", str(copies[0]), "--num_processes", "2",
               *TINY_FROM_SCRATCH, "--max_steps", "1", "--output_dir", str(tmp_path / "out"),
               "--report_to", "none"]  # fmt: skip
    return subprocess.run(command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S)  # fmt: skip


def zero_key(key: str, value: object) -> Callable[[str], str]:
    """An edit of a DeepSpeed JSON's text: zero_optimization's `key` set to `value`."""

    def edit(text: str) -> str:
        config = json.loads(text)
        config["zero_optimization"][key] = value
        return json.dumps(config)

    return edit


def the_one_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("finetune: error:")]
    return line


@pytest.mark.integration
def test_zero_plus_plus_quantized_collectives_off_cuda_are_one_error_line(tmp_path):
    """DeepSpeed's quantizer op has CUDA kernels only: refused before zero.Init raises on every rank."""
    line = the_one_error(run_copied_profile(tmp_path, "zero3", zero_key("zero_quantized_gradients", True)))
    assert line.endswith(
        "zero3.json: zero_optimization.zero_quantized_gradients: ZeRO++'s quantized collectives run on CUDA "
        "GPUs only (DeepSpeed's quantizer op has no CPU kernels): set it false on this machine"
    )


@pytest.mark.integration
def test_zero3_without_gathering_its_weights_on_save_is_refused_before_training(tmp_path):
    """accelerate would refuse to gather the final model only after the whole training."""
    gather_nothing = zero_key("stage3_gather_16bit_weights_on_model_save", False)
    result = run_copied_profile(tmp_path, "zero3", gather_nothing)
    assert the_one_error(result).endswith(
        "zero3.json: zero_optimization.stage3_gather_16bit_weights_on_model_save: must be true under ZeRO-3 "
        "(DeepSpeed's default is false): the run ends by gathering the weights into its model folder"
    )
    assert not list((tmp_path / "out").glob("checkpoint-*"))  # stopped before the first step


@pytest.mark.integration
def test_fsdp2_parameter_offload_without_a_gpu_is_one_error_line(tmp_path):
    """torch's CPUOffloadPolicy asks for the accelerator on every rank."""

    def offload_parameters(text: str) -> str:
        return text.replace("fsdp_offload_params: false", "fsdp_offload_params: true")

    line = the_one_error(run_copied_profile(tmp_path, "fsdp", offload_parameters))
    assert line.endswith(
        "fsdp_config.fsdp_offload_params moves FSDP2's states from a GPU to CPU memory and needs a GPU: "
        "without one set it false (the states are in CPU memory already)"
    )


@pytest.mark.integration
def test_bare_accelerate_launch_prints_a_rank_error_once(tmp_path):
    """The launcher's own ending (exit 1, ChildFailedError's traceback) is accelerate's and stays."""
    result = launched(accelerate_launch("ddp"), tmp_path)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("finetune: error:")]
    assert len(lines) == 1 and "model 'no-such-model' not found" in lines[0], result.stderr[-3000:]


def test_a_jsonl_with_an_unterminated_object_names_its_line(output_flags, make_text_file, capsys):
    lines = "".join(f'{{"text": "line {n} of the file"}}\n' for n in range(100)) + '{"text": "abc"\n'
    path = make_text_file("docs.jsonl", lines)
    assert_one_error(
        [*TINY_FROM_SCRATCH, "--dataset", str(path), *output_flags], capsys, "line 101: not valid JSON"
    )


def test_a_flag_of_the_wrong_type_is_one_line_without_the_usage(capsys):
    with pytest.raises(SystemExit) as stopped:
        run.main(["--max_steps", "two"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "finetune: error: argument --max_steps/--max-steps: invalid int value: 'two' "
        "(`finetune/run.py --help` lists the flags)"
    ]


def test_a_commands_flag_of_the_wrong_type_is_one_line_without_the_usage(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["plan", "--gpus", "two"])
    assert stopped.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--gpus", "0"], "argument --gpus: invalid positive int value: '0'"),
        (["--batch_size", "0"], "--batch_size must be at least 1, got 0"),  # as `finetune run` says it
        (["--gpu_memory", "-80"], "argument --gpu_memory/--gpu-memory: invalid positive number value: '-80'"),
        (["--margin", "1.5"], "argument --margin: invalid fraction (0 to below 1) value: '1.5'"),
        (["--config_overrides", "n_embd=100,n_head=3"], "`embed_dim` must be divisible by num_heads"),
        (["--config_overrides", "n_layer=0"], "--config_overrides 'n_layer=0': n_layer must be at least 1"),
    ],
)
def test_plan_refuses_numbers_it_cannot_plan_in_one_line(flags, expected, capsys):
    argv = ["plan", "--model", "gpt2", "--gpu_memory", "80", *flags]
    assert_one_error(argv, capsys, expected, entry=cli.main)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [(["--timeout", "0"], "argument --timeout: invalid positive number value: '0'"),
     (["--gpus", "0"], "invalid positive int value: '0'")],
)  # fmt: skip
def test_compare_refuses_a_timeout_or_count_that_is_not_positive(flags, expected, tmp_path, capsys):
    argv = ["compare", "--profiles", "ddp", *flags, *TINY_FROM_SCRATCH, "--output_dir", str(tmp_path)]
    assert_one_error(argv, capsys, expected, entry=cli.main)


def test_a_folder_of_files_with_other_columns_names_both_files(make_text_file, output_flags, capsys):
    first = make_text_file("mixed/a.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n' * 3)
    second = make_text_file("mixed/b.jsonl", '{"text": "plain words"}\n' * 3)
    argv = [*TINY_FROM_SCRATCH, "--dataset", str(first.parent), *output_flags]
    lines = error_lines(argv, capsys, run.main)
    assert len(lines) == 1, lines
    assert f"{first} has messages, {second} has text; one dataset takes one layout" in lines[0]


def test_an_empty_tokenizer_file_is_one_line_naming_it(tmp_path, data_dir, output_flags, capsys):
    import shutil

    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(data_dir / "gpt2", tokenizer)
    (tokenizer / "tokenizer.json").unlink(missing_ok=True)
    (tokenizer / "vocab.json").write_text("")
    argv = [*TINY_FROM_SCRATCH, "--tokenizer", str(tokenizer), *output_flags]
    assert_one_error(argv, capsys, f"cannot load a tokenizer from {tokenizer} (vocab.json empty)")


def test_an_output_dir_name_over_the_file_systems_limit_is_one_line(tmp_path, capsys):
    argv = [*TINY_FROM_SCRATCH, "--output_dir", str(tmp_path / ("a" * 300))]
    assert_one_error(argv, capsys, "--output_dir: the folder name aaaa")
