"""`--global_batch_size N`: the largest micro batch that divides each process's share and is predicted
to fit, the accumulation that keeps N exactly, logged and in the run summary; and the start-up time
to the first optimizer step.

The planner's memory model is tested in tests/test_planner.py; here only how the run uses it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import TrainerState
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

from finetune import run
from finetune.arguments import parse_arguments
from finetune.calibration import measured_calibration
from finetune.callbacks import StartupCallback
from finetune.checkpoint import write_manifest
from finetune.errors import FinetuneError
from finetune.launched import BatchGeometry, Launch
from finetune.layout import ParallelLayout
from finetune.memory_model import estimate
from finetune.model_shapes import shape_of
from finetune.planner import apply_global_batch
from finetune.resume import refuse_another_run
from finetune.summary import read_summary, validate_summary
from finetune.workload import Workload

from launching import PROJECT_ROOT, TINY_MODEL, resolve_and_set_up

WHY = "the limit's reason"


def launched(argv: list[str]):
    """The three argument dataclasses as run.py has them before the global batch is applied."""
    model_args, data_args, training_args = parse_arguments(argv)
    resolve_and_set_up(training_args, Launch.from_environment())
    return model_args, data_args, training_args


# ---------------------------------------------------------------------------------------------------
# Splitting the global batch


def test_the_micro_batch_is_the_largest_that_fits_and_divides_each_processs_share():
    choice, _ = BatchGeometry.from_global(64, 2, largest=(12, WHY))
    assert (choice.micro, choice.accumulation) == (8, 4)


def test_a_share_with_no_divisor_up_to_the_limit_but_small_ones_takes_the_largest_small_one():
    choice, _ = BatchGeometry.from_global(14, 1, largest=(6, WHY))
    assert (choice.micro, choice.accumulation) == (2, 7)


def test_a_share_smaller_than_what_fits_is_one_micro_batch_without_accumulation():
    choice, _ = BatchGeometry.from_global(16, 2, largest=(100, WHY))
    assert (choice.micro, choice.accumulation) == (8, 1)


def test_the_choice_says_how_the_global_batch_is_made_and_why():
    choice, reason = BatchGeometry.from_global(64, 2, largest=(12, WHY))
    assert f"{choice.describe()}: {reason}" == (
        "global batch 64 = micro batch 8 x accumulation 4 x 2 processes: the largest micro batch that "
        f"divides 32 per process and is {WHY}"
    )


def test_a_global_batch_the_processes_cannot_share_equally_is_one_error():
    with pytest.raises(FinetuneError, match=r"^--global_batch_size 63 is not a multiple of the 2 processes"):
        BatchGeometry.from_global(63, 2, largest=(12, WHY))


def test_a_given_micro_batch_is_kept_and_the_accumulation_makes_the_rest():
    choice, reason = BatchGeometry.from_global(64, 2, micro=4)
    assert (choice.micro, choice.accumulation, reason) == (
        4,
        8,
        "--batch_size as given",
    )


def test_a_given_accumulation_is_kept_and_the_micro_batch_makes_the_rest():
    choice, _ = BatchGeometry.from_global(64, 2, accumulation=4)
    assert (choice.micro, choice.accumulation) == (8, 4)


def test_a_given_micro_batch_that_cannot_make_the_global_batch_is_one_error():
    with pytest.raises(FinetuneError, match=r"not a multiple of --batch_size 3 x 2 processes"):
        BatchGeometry.from_global(64, 2, micro=3)


def test_a_micro_batch_and_accumulation_that_disagree_with_the_global_batch_are_one_error():
    with pytest.raises(FinetuneError) as error:
        BatchGeometry.from_global(64, 2, micro=4, accumulation=4)
    assert str(error.value) == (
        "--global_batch_size 64 disagrees with --batch_size 4 x --gradient_accumulation_steps 4 x 2 "
        "processes = 32: leave out one of them, or both to have the micro batch planned"
    )


# ---------------------------------------------------------------------------------------------------
# The run's arguments


def test_a_batch_flag_given_at_its_default_value_still_counts_as_given(output_flags):
    _, _, training_args = parse_arguments(
        [
            *output_flags,
            "--global_batch_size",
            "64",
            "--batch_size",
            "8",
            "--gradient_accumulation_steps",
            "1",
        ]
    )
    assert training_args.batch_flags_given == {"per_device_train_batch_size", "gradient_accumulation_steps"}


def test_a_recipes_batch_size_counts_as_given(output_flags, make_text_file):
    recipe = make_text_file("recipe.yaml", "batch_size: 4\n")
    _, _, training_args = parse_arguments([str(recipe), *output_flags, "--global_batch_size", "64"])
    assert training_args.batch_flags_given == {"per_device_train_batch_size"}


def test_given_batch_flags_that_disagree_with_the_global_batch_stop_the_run_before_training(output_flags):
    flags = [
        *output_flags,
        "--global_batch_size",
        "64",
        "--batch_size",
        "4",
        "--gradient_accumulation_steps",
        "4",
    ]
    with pytest.raises(
        FinetuneError, match=r"disagrees with --batch_size 4 x --gradient_accumulation_steps 4"
    ):
        apply_global_batch(*launched(flags), Launch.from_environment())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--global_batch_size", "0"], "--global_batch_size must be at least 1, got 0"),
        (["--global_batch_size", "8", "--gpu_memory_gib", "0"], "--gpu_memory_gib must be positive, got 0.0"),
        (["--gpu_memory_gib", "80"], "--gpu_memory_gib is only used with --global_batch_size"),
    ],
)
def test_bad_global_batch_flags_are_one_error(output_flags, flags, message):
    with pytest.raises(FinetuneError, match=f"^{message}$"):
        parse_arguments([*output_flags, *flags])


def test_on_the_given_gpu_memory_the_micro_batch_is_the_largest_dividing_one_predicted_to_fit(output_flags):
    flags = [*output_flags, "--model", "gpt2-medium", "--global_batch_size", "96", "--gpu_memory_gib", "24"]
    model_args, data_args, training_args = launched(flags)
    choice = apply_global_batch(model_args, data_args, training_args, Launch.from_environment())
    shape, block = shape_of("gpt2-medium")
    dtype = "bf16" if training_args.bf16 else "fp32"
    workload = Workload(choice.micro, block, dtype, False, training_args.torch_compile)

    def fits(micro_batch: int) -> bool:
        e = estimate(
            Launch.from_environment().strategy,
            shape,
            replace(workload, micro_batch=micro_batch),
            ParallelLayout(1),
            measured_calibration(),
        )
        return e.fits(24)

    next_divisor = next(size for size in range(choice.micro + 1, 97) if 96 % size == 0)
    assert fits(choice.micro) and not fits(next_divisor)
    assert choice.micro * choice.accumulation == 96
    assert (training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps) == (
        choice.micro,
        choice.accumulation,
    )
    assert "predicted to fit single on 1 x 24 GiB" in training_args.batch_choice


def test_under_zero3_the_micro_batch_is_planned_from_the_config_without_zero3_partitioning(
    output_flags, monkeypatch
):
    """Once a ZeRO-3 run's arguments exist, transformers builds every model under ZeRO-3's
    partitioning, which cannot fill the meta-device model the planner counts (it failed on an H100)."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(PROJECT_ROOT / "ds_configs" / "zero3.json"))
    flags = [*output_flags, "--model", "gpt2-medium", "--global_batch_size", "32", "--gpu_memory_gib", "80"]
    model_args, data_args, training_args = launched(flags)
    assert is_deepspeed_zero3_enabled()
    choice = apply_global_batch(model_args, data_args, training_args, Launch.from_environment())
    assert choice.micro * choice.accumulation == 32
    assert "predicted to fit zero3 on 1 x 80 GiB" in training_args.batch_choice
    assert is_deepspeed_zero3_enabled()


def test_an_accumulation_the_global_batch_makes_leaves_the_profiles_cuda_graphs_out(
    output_flags, monkeypatch
):
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")  # as the single profile launches
    flags = [*output_flags, "--torch_compile", "true", "--global_batch_size", "16", "--batch_size", "8"]
    model_args, data_args, training_args = launched(flags)
    assert training_args.torch_compile_mode is None
    apply_global_batch(model_args, data_args, training_args, Launch.from_environment())
    assert (training_args.gradient_accumulation_steps, training_args.torch_compile_mode) == (2, "default")


def test_a_model_no_micro_batch_fits_is_one_error_pointing_to_the_planner(output_flags):
    flags = [*output_flags, "--model", "gpt2-xl", "--global_batch_size", "8", "--gpu_memory_gib", "4"]
    with pytest.raises(FinetuneError, match=r"not even micro batch 1 of gpt2-xl .* \(`finetune plan` shows"):
        apply_global_batch(*launched(flags), Launch.from_environment())


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU assumes")
def test_without_a_gpu_the_micro_batch_is_at_most_the_default_batch_size_and_says_so(output_flags):
    model_args, data_args, training_args = launched([*output_flags, "--global_batch_size", "64"])
    choice = apply_global_batch(model_args, data_args, training_args, Launch.from_environment())
    assert (choice.micro, choice.accumulation) == (8, 8)
    assert "no GPU is visible to plan for (--gpu_memory_gib plans for one)" in training_args.batch_choice


def test_without_global_batch_size_the_batch_flags_are_left_alone(output_flags):
    model_args, data_args, training_args = launched([*output_flags, "--batch_size", "3"])
    assert apply_global_batch(model_args, data_args, training_args, Launch.from_environment()) is None
    assert (training_args.per_device_train_batch_size, training_args.batch_choice) == (3, None)


# ---------------------------------------------------------------------------------------------------
# Resume


@pytest.fixture
def checkpoint_of_global_batch_32(tmp_path):
    """A checkpoint (manifest and trainer state: all a refusal reads) of 1 process, micro batch 8 x 4."""
    checkpoint = tmp_path / "out" / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    TrainerState(global_step=10, max_steps=20).save_to_json(str(checkpoint / "trainer_state.json"))
    identity = {
        "strategy": "single",
        "world_size": 1,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 4,
    }
    write_manifest(checkpoint, 10, "run-a", {**identity, "global_batch_size": 32, "flags": {}})
    return checkpoint, {**identity, "global_batch_size": 32, "flags": {}}


def test_a_resume_asking_for_another_global_batch_is_refused_even_with_a_world_size_change(
    checkpoint_of_global_batch_32, in_process_commands, capsys
):
    checkpoint, _ = checkpoint_of_global_batch_32
    flags = [*TINY_MODEL, "--output_dir", str(checkpoint.parent), "--report_to", "none", "--max_steps", "20"]
    with pytest.raises(SystemExit) as exit:
        run.main([*flags, "--global_batch_size", "64", "--resume", "--allow_world_size_change"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: error:")]
    assert (exit.value.code, errors) == (
        2,
        [
            "finetune: error: checkpoint-10 was written with global batch 32; this run asks for "
            "--global_batch_size 64: resume with --global_batch_size 32, or start a new run in another "
            "--output_dir"
        ],
    )


def test_a_resume_asking_for_the_checkpoints_global_batch_continues(checkpoint_of_global_batch_32):
    checkpoint, identity = checkpoint_of_global_batch_32
    refuse_another_run(checkpoint, identity, False, True, global_batch_size=32)


# ---------------------------------------------------------------------------------------------------
# Start-up time


def test_start_up_is_the_time_from_the_process_start_to_the_first_step_end():
    startup = StartupCallback(started_at=100.0, clock=iter([112.5, 130.0]).__next__, on_gpu=False)
    assert startup.summary() == {"time_to_first_step_s": None, "startup_phases_s": None}
    startup.on_step_end(None, None, None)
    startup.on_step_end(None, None, None)
    assert startup.summary()["time_to_first_step_s"] == 12.5


def test_start_up_phases_end_at_each_mark_and_add_up_to_the_start_up():
    clock = iter([101.0, 104.0, 120.0, 122.5, 160.0]).__next__
    startup = StartupCallback(started_at=100.0, clock=clock, on_gpu=False)
    for phase in ("imports", "data", "model"):
        startup.mark(phase)
    startup.on_train_begin(None, None, None)
    startup.on_step_end(None, None, None)
    phases = startup.summary()["startup_phases_s"]
    assert phases == {"imports": 1.0, "data": 3.0, "model": 16.0, "wrapping": 2.5, "first step": 37.5}
    assert sum(phases.values()) == startup.summary()["time_to_first_step_s"]


def test_a_resumed_trains_second_train_begin_is_not_a_start_up_phase():
    startup = StartupCallback(started_at=0.0, clock=iter([1.0, 2.0, 3.0]).__next__, on_gpu=False)
    startup.on_train_begin(None, None, None)
    startup.on_step_end(None, None, None)
    startup.on_train_begin(None, None, None)
    assert list(startup.summary()["startup_phases_s"]) == ["wrapping", "first step"]


# ---------------------------------------------------------------------------------------------------
# A run


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans without a GPU: micro batch 8")
def test_a_run_records_and_prints_the_batch_choice_and_its_start_up(
    tmp_path, make_text_file, in_process_commands, capsys, caplog
):
    text = make_text_file(
        "train.txt", "\n".join(f"line {i} of a small corpus for one test." for i in range(600))
    )
    output_dir = tmp_path / "out"
    run.main(
        [*TINY_MODEL, "--dataset", str(text), "--block_size", "64", "--max_steps", "2",
         "--global_batch_size", "16", "--max_eval_samples", "4", "--save_strategy", "no",
         "--report_to", "none", "--disable_tqdm", "true", "--output_dir", str(output_dir)]
    )  # fmt: skip
    summary = read_summary(output_dir)
    assert validate_summary(summary) == []
    batch = {
        name: summary[name]
        for name in ("global_batch_size", "micro_batch_size", "gradient_accumulation_steps")
    }
    assert batch == {"global_batch_size": 16, "micro_batch_size": 8, "gradient_accumulation_steps": 2}
    assert "no GPU is visible" in summary["batch_choice"]
    assert summary["time_to_first_step_s"] > 0
    printed = capsys.readouterr()
    choice = (
        f"finetune: global batch 16 = micro batch 8 x accumulation 2 x 1 process: {summary['batch_choice']}"
    )
    assert caplog.messages.count(choice) == 1
    assert "  batch       micro batch 8 x accumulation 2 x 1 process(es): the largest" in printed.out
    assert "  start-up    " in printed.out
    assert list(summary["startup_phases_s"]) == ["imports", "data", "model", "wrapping", "first step"]
    assert f"first step {summary['startup_phases_s']['first step']:.1f})" in printed.out


# ---------------------------------------------------------------------------------------------------
# Evaluation's micro batch


def test_evaluation_takes_the_training_micro_batch(output_flags):
    _, _, training_args = launched([*output_flags, "--batch_size", "3"])
    assert training_args.per_device_eval_batch_size == 3


def test_evaluation_takes_the_micro_batch_the_global_batch_chose(output_flags):
    model_args, data_args, training_args = launched([*output_flags, "--global_batch_size", "12"])
    apply_global_batch(model_args, data_args, training_args, Launch.from_environment())
    assert (training_args.per_device_train_batch_size, training_args.per_device_eval_batch_size) == (6, 6)


def test_a_given_evaluation_batch_is_kept(output_flags):
    flags = [*output_flags, "--global_batch_size", "12", "--per_device_eval_batch_size", "8"]
    model_args, data_args, training_args = launched(flags)
    apply_global_batch(model_args, data_args, training_args, Launch.from_environment())
    assert (training_args.per_device_train_batch_size, training_args.per_device_eval_batch_size) == (6, 8)
