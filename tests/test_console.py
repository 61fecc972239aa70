"""What a person reads in the terminal: a compact line per log, a progress bar, no warnings at every run.

The line is checked from fake logs; the Trainer's own printers are checked replaced; two tiny real runs
(one process with the default progress bar, two DDP ranks with `--disable_tqdm true`) are read for the
lines and for the warnings each used to print (pin_memory, DeepSpeed's accelerator detection, the pad
token, DDP's find_unused_parameters).
"""

import sys

import pytest
from transformers import AutoModelForCausalLM, GPT2Config, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from finetune.arguments import parse_arguments
from finetune.console import (
    ConsoleLines,
    ConsolePrinterCallback,
    ConsoleProgressCallback,
    evaluation_line,
    training_line,
)
from finetune.summary import read_summary
from finetune.trainer import FinetuneTrainer

from launching import TINY_MODEL, accelerate_launch, launch

GPU_LOG = {
    "loss": 6.1123,
    "grad_norm": 1.2345,
    "learning_rate": 9.5e-4,
    "memory/peak_allocated_gib_max": 15.02,
    "memory/peak_allocated_gib_mean": 14.9,
    "memory/host_peak_rss_gib_max": 3.1,
    "throughput/tokens_per_second_per_device": 12_345.0,
    "throughput/mfu": 0.3124,
    "throughput/step_time_s": 0.5,
    "epoch": 0.2,
}
CPU_LOG_BEFORE_WARM_UP = {
    "loss": 10.84,
    "grad_norm": 2.05,
    "learning_rate": 0.0,
    "memory/host_rss_gib_max": 0.54,
    "memory/host_peak_rss_gib_max": 0.66,
    "epoch": 0.02,
}


def state_at(step: int, max_steps: int = 200, world_process_zero: bool = True) -> TrainerState:
    state = TrainerState(global_step=step, max_steps=max_steps)
    state.is_world_process_zero = world_process_zero
    return state


def test_a_training_log_is_one_line_of_the_numbers_a_person_follows():
    line = training_line(GPU_LOG, step=40, max_steps=200, eta_s=192)
    assert line == (
        "step 40/200 | loss 6.112 | lr 9.5e-04 | grad 1.23 | 12.3k tok/s/dev | MFU 31.2% | peak 15.0 GiB"
        " | ETA 3m12s"
    )


def test_measurements_a_log_does_not_have_are_left_out():
    line = training_line(CPU_LOG_BEFORE_WARM_UP, step=1, max_steps=12, eta_s=None)
    assert line == "step 1/12 | loss 10.84 | lr 0.0e+00 | grad 2.05 | host peak 0.7 GiB"


def test_an_evaluation_is_one_line_with_its_token_weighted_loss():
    logs = {"eval_loss": 10.9, "eval_token_loss": 10.78, "eval_perplexity": 48034.6, "eval_runtime": 2.0}
    assert evaluation_line(logs, step=12) == "eval at step 12 | loss 10.78 | perplexity 4.803e+04"


@pytest.mark.parametrize(
    "logs",
    [
        {"train_runtime": 5.2, "train_samples_per_second": 9.2, "train_loss": 10.81, "epoch": 0.24},
        {"run/tokens_per_second_per_device": 640.0, "run/peak_memory_gib": 0.7},
    ],
)
def test_logs_the_closing_report_states_print_nothing(logs):
    assert ConsoleLines().line(state_at(12), logs) is None


def test_the_eta_extrapolates_the_time_per_step_since_the_first_log():
    clock = iter([100.0, 130.0])
    lines = ConsoleLines(clock=lambda: next(clock))
    assert "ETA" not in lines.line(state_at(1), {"loss": 6.0})
    assert lines.line(state_at(31), {"loss": 5.0}).endswith("ETA 2m49s")  # 1 s per step, 169 steps to go


@pytest.fixture
def trainer_with(tmp_path):
    def build(disable_tqdm: bool) -> FinetuneTrainer:
        model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
        args = TrainingArguments(
            output_dir=str(tmp_path), report_to="none", use_cpu=True, disable_tqdm=disable_tqdm
        )
        return FinetuneTrainer(model=model, args=args)

    return build


@pytest.mark.parametrize(
    ("disable_tqdm", "console"), [(False, ConsoleProgressCallback), (True, ConsolePrinterCallback)]
)
def test_the_trainers_printer_is_replaced_by_the_compact_one(trainer_with, disable_tqdm, console):
    callbacks = trainer_with(disable_tqdm).callback_handler.callbacks
    printers = [
        callback for callback in callbacks if isinstance(callback, (PrinterCallback, ProgressCallback))
    ]
    assert [type(printer) for printer in printers] == [console]


@pytest.mark.parametrize("console", [ConsoleProgressCallback, ConsolePrinterCallback])
def test_only_the_first_rank_of_the_run_prints(console, capsys):
    args, control = TrainingArguments(output_dir="out", report_to="none", use_cpu=True), TrainerControl()
    console().on_log(args, state_at(40, world_process_zero=False), control, logs=dict(GPU_LOG))
    assert capsys.readouterr().out == ""
    console().on_log(args, state_at(40), control, logs=dict(GPU_LOG))
    assert capsys.readouterr().out.startswith("step 40/200 | loss 6.112 |")


def test_ddp_does_not_search_every_step_for_unused_parameters(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    assert training_args.ddp_find_unused_parameters is False


# ---------------------------------------------------------------------------------------------------
# Real runs

MAX_STEPS = 8
RUN_FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "64", "--max_steps", str(MAX_STEPS),
    "--batch_size", "4", "--max_eval_samples", "16", "--save_strategy", "no", "--logging_steps", "4",
    "--throughput_warmup_steps", "2", "--report_to", "none",
]  # fmt: skip
# (the run that printed it, what it printed): one process pinned memory without a GPU, DDP ranks searched
# for unused parameters, and both detected DeepSpeed's accelerator and aligned the pad token on every rank.
WARNINGS_FIXED = {
    "pin_memory": ("one_process_run", "'pin_memory' argument is set as true"),
    "accelerator detection, one process": ("one_process_run", "Setting accelerator to CPU"),
    "accelerator detection, ddp": ("ddp_run", "Setting accelerator to CPU"),
    "pad token, one process": ("one_process_run", "The tokenizer has new PAD/BOS/EOS tokens"),
    "pad token, ddp": ("ddp_run", "The tokenizer has new PAD/BOS/EOS tokens"),
    "find_unused_parameters": ("ddp_run", "find_unused_parameters=True was specified"),
}


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    """python finetune/run.py, progress bar on as by default."""
    return launch([sys.executable, "finetune/run.py"], tmp_path_factory.mktemp("one"), RUN_FLAGS)


@pytest.fixture(scope="module")
def ddp_output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ddp")


@pytest.fixture(scope="module")
def ddp_run(ddp_output_dir):
    """accelerate launch --config_file accelerate_configs/ddp.yaml --num_processes 2, --disable_tqdm true."""
    return launch(accelerate_launch("ddp"), ddp_output_dir, [*RUN_FLAGS, "--disable_tqdm", "true"])


@pytest.mark.parametrize("run", ["one_process_run", "ddp_run"])
@pytest.mark.integration
def test_a_run_prints_a_compact_line_per_log_and_no_dict(run, request):
    stdout = request.getfixturevalue(run).stdout
    training = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in training] == ["step 1/8", "step 4/8", "step 8/8"]
    assert "eval at step 8 | loss " in stdout
    assert "{'loss'" not in stdout and "'memory/" not in stdout


def test_the_training_progress_bar_is_shown_by_default(one_process_run):
    assert f"{MAX_STEPS}/{MAX_STEPS} [" in one_process_run.stderr


@pytest.mark.parametrize("warning", WARNINGS_FIXED)
def test_a_cpu_run_no_longer_prints_a_warning_fixed_at_its_cause(warning, request):
    run, text = WARNINGS_FIXED[warning]
    result = request.getfixturevalue(run)
    assert text not in result.stdout + result.stderr


@pytest.mark.integration
def test_ddp_gradients_as_bucket_views_train_exactly_as_copies(ddp_run, ddp_output_dir, tmp_path):
    """--ddp_gradient_as_bucket_view reaches DDP (the summary reads it off the wrapper) and changes only
    where the gradients live, not their values."""
    flags = [*RUN_FLAGS, "--disable_tqdm", "true", "--ddp_gradient_as_bucket_view", "true"]
    launch(accelerate_launch("ddp"), tmp_path, flags)
    copies, views = read_summary(ddp_output_dir), read_summary(tmp_path)
    assert (copies["ddp_gradient_buckets"], views["ddp_gradient_buckets"]) == ("copies", "views")
    assert [p["loss"] for p in views["loss_curve"]] == [p["loss"] for p in copies["loss_curve"]]
    assert views["eval_loss"] == copies["eval_loss"]


def test_ddp_without_the_unused_parameter_search_trains_gpt2_with_tied_weights(ddp_run, ddp_output_dir):
    """DDP fails at the second step when a parameter took no part in the first: none did."""
    summary = read_summary(ddp_output_dir)
    assert summary["arguments"]["ddp_find_unused_parameters"] is False
    assert summary["distributed_type"] == "MULTI_CPU" and summary["world_size"] == 2
    assert summary["status"] == "completed" and summary["steps"] == MAX_STEPS
