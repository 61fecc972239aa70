"""A diverged run stops at the step it diverged, says so in one line, exits 3, and saves nothing from it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from finetune import run
from finetune.divergence import DivergenceGuard
from finetune.errors import DIVERGED_EXIT_CODE, Diverged
from finetune.summary import read_summary

from launching import (
    ENVIRONMENT,
    LAUNCH_TIMEOUT_S,
    PROJECT_ROOT,
    TINY_DEEPSPEED_ENGINE,
    TINY_MODEL,
    one_process_script,
)

VOCAB = 50257
FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "32", "--batch_size", "2",
    "--max_steps", "8", "--logging_steps", "1", "--save_steps", "1", "--max_eval_samples", "4",
    "--report_to", "none", "--disable_tqdm", "true",
]  # fmt: skip


@pytest.mark.parametrize("norm", [math.nan, math.inf])
def test_a_non_finite_gradient_norm_names_the_step(norm):
    with pytest.raises(Diverged, match=f"step 7: gradient norm {norm}"):
        DivergenceGuard(10, VOCAB).check_gradient_norm(7, norm)


def test_a_finite_gradient_norm_passes_however_large():
    DivergenceGuard(10, VOCAB).check_gradient_norm(1, 1e30)


def test_a_norm_on_the_device_is_not_read_until_checked_and_the_first_non_finite_step_is_named():
    guard = DivergenceGuard(10, VOCAB)
    for step, norm in enumerate([1.0, math.inf, math.nan, 2.0], start=1):
        guard.observe_gradient_norm(step, torch.tensor(norm))  # no raise: nothing is read here
    with pytest.raises(Diverged, match="step 2: gradient norm inf"):
        guard.check_observed()


def test_finite_norms_on_the_device_pass_the_check():
    guard = DivergenceGuard(10, VOCAB)
    guard.check_observed()  # nothing observed yet
    for step in range(1, 4):
        guard.observe_gradient_norm(step, torch.tensor(1e30))
    guard.check_observed()


def test_a_norm_given_as_a_number_is_checked_at_once():
    with pytest.raises(Diverged, match="step 3: gradient norm nan"):
        DivergenceGuard(10, VOCAB).observe_gradient_norm(3, math.nan)


def test_a_loss_spike_over_the_factor_and_a_uniform_guess_stops():
    guard = DivergenceGuard(10, VOCAB)
    for step, loss in enumerate([10.9, 9.0, 7.5], start=1):
        guard.check_logged_loss(step, loss)
    with pytest.raises(Diverged, match=r"step 4: loss 1e\+07 is over 10x the recent median 9"):
        guard.check_logged_loss(4, 1e7)


def test_a_spike_below_a_uniform_guess_is_training_not_divergence():
    """Overfitting a small set, the loss may sit near 0.1 and jump to a few nats on a new epoch."""
    guard = DivergenceGuard(10, VOCAB)
    for step, loss in enumerate([0.1, 0.1, 0.1], start=1):
        guard.check_logged_loss(step, loss)
    guard.check_logged_loss(4, 3.0)


def test_factor_zero_turns_the_spike_check_off_but_not_the_non_finite_one():
    guard = DivergenceGuard(0, VOCAB)
    guard.check_logged_loss(1, 10.0)
    guard.check_logged_loss(2, 1e9)
    with pytest.raises(Diverged):
        guard.check_logged_loss(3, math.nan)


def diverged_run(flags: list[str], output_dir, capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        run.main([*flags, "--output_dir", str(output_dir)])
    assert stopped.value.code == DIVERGED_EXIT_CODE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune: diverged")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_huge_learning_rate_stops_as_diverged_without_a_nan_model_or_checkpoint(
    tmp_path, capsys, in_process_commands
):
    output_dir = tmp_path / "out"
    line = diverged_run([*FLAGS, "--learning_rate", "1e38"], output_dir, capsys)
    summary = read_summary(output_dir)
    assert summary["status"] == "diverged"
    step = int(summary["error"].split("step ")[1].split(":")[0])
    assert f"step {step}:" in line and step < 8
    assert not (output_dir / "model.safetensors").exists()
    checkpoints = sorted(output_dir.glob("checkpoint-*"))
    expected = [f"checkpoint-{n}" for n in range(1, step)]
    assert [path.name for path in checkpoints] == expected[len(expected) - len(checkpoints) :]
    for checkpoint in checkpoints:
        for name, tensor in load_file(checkpoint / "model.safetensors").items():
            assert tensor.isfinite().all(), f"{checkpoint.name}: {name}"


def test_a_diverged_run_names_its_newest_checkpoint_and_how_to_go_on_at_another_learning_rate(
    tmp_path, capsys, in_process_commands
):
    output_dir = tmp_path / "out"
    line = diverged_run([*FLAGS, "--learning_rate", "1e38"], output_dir, capsys)
    newest = max(output_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    assert read_summary(output_dir)["checkpoint"] == str(newest)
    assert f"finetune export {newest} DIR, then run with --model DIR and a lower --learning_rate" in line


def test_a_diverged_run_leaves_no_watchdog_armed_in_its_process(tmp_path, capsys, in_process_commands):
    """Armed, it fired ten minutes later in the pytest worker that had run the diverged run, and
    ended it (os._exit): the run's process is not always the run's alone."""
    diverged_run([*FLAGS, "--learning_rate", "1e38", "--save_strategy", "no"], tmp_path / "out", capsys)
    deadline = time.monotonic() + 5
    while any(thread.name == "finetune-watchdog" for thread in threading.enumerate()):
        assert time.monotonic() < deadline, "the watchdog thread still runs after the run ended"
        time.sleep(0.1)


def test_a_diverged_run_without_checkpoints_says_to_start_again_lower(tmp_path, capsys, in_process_commands):
    output_dir = tmp_path / "out"
    flags = [*FLAGS, "--learning_rate", "1e3", "--save_strategy", "no"]
    line = diverged_run(flags, output_dir, capsys)
    assert line.endswith("no checkpoint was saved: start again with a lower --learning_rate")


def test_a_learning_rate_that_blows_the_loss_up_stops_at_the_spike(tmp_path, capsys, in_process_commands):
    output_dir = tmp_path / "out"
    diverged_run([*FLAGS, "--learning_rate", "1e3", "--save_strategy", "no"], output_dir, capsys)
    assert read_summary(output_dir)["status"] == "diverged"


def test_a_save_between_logs_checks_the_loss_since_the_last_log(tmp_path, capsys, in_process_commands):
    """Logged at step 1 and every 10, saved every 5: the save at step 5 is where the spike shows first."""
    output_dir = tmp_path / "out"
    flags = [
        *FLAGS,
        "--learning_rate",
        "1e3",
        "--logging_steps",
        "10",
        "--save_steps",
        "5",
        "--max_steps",
        "20",
    ]
    line = diverged_run(flags, output_dir, capsys)
    assert "diverged at step 5: loss" in line
    assert not list(output_dir.glob("checkpoint-*"))


def test_a_checkpoint_keeps_the_recent_losses_for_the_check_after_a_resume():
    from finetune.trainer import LossSumSoFar

    guard = DivergenceGuard(10, VOCAB)
    for step, loss in enumerate([10.9, 9.0, 7.5], start=1):
        guard.check_logged_loss(step, loss)
    saved = LossSumSoFar(27.4, guard.recent_losses()).state()
    resumed = DivergenceGuard(10, VOCAB)
    resumed.logged_losses = saved["args"]["recent_losses"]
    with pytest.raises(Diverged, match="step 4: loss 1e\\+07 is over 10x the recent median 9"):
        resumed.check_logged_loss(4, 1e7)


@pytest.mark.integration
def test_two_ranks_stop_together_with_one_line_and_exit_3(tmp_path):
    output_dir = tmp_path / "out"
    command = [sys.executable, "-m", "finetune", "run", "--profile", "ddp", "--num_processes", "2",
               *FLAGS, "--learning_rate", "1e38", "--output_dir", str(output_dir)]  # fmt: skip
    result = subprocess.run(command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True,
                            timeout=LAUNCH_TIMEOUT_S)  # fmt: skip
    assert result.returncode == DIVERGED_EXIT_CODE, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if "diverged at step" in line]) == 1
    assert json.loads((output_dir / "run_summary.json").read_text())["status"] == "diverged"


NAN_STEP_SCRIPT = (
    TINY_DEEPSPEED_ENGINE
    + """
import json, math, sys
from finetune.divergence import DivergenceGuard
from finetune.errors import Diverged
from finetune.profiles import load_profile
profile, check = sys.argv[2], json.loads(sys.argv[3])
config = json.loads(load_profile(profile).deepspeed_config_path.read_text())
config["bf16"]["enabled"], config["fp16"]["enabled"] = True, False
if check is not None:
    config["bf16"]["check_grad_overflow"] = check
config.update(train_batch_size=2, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1,
              gradient_clipping=1.0, zero_allow_untested_optimizer=True, zero_force_ds_cpu_optimizer=False)
engine, ids = tiny_gpt2_engine(config)
engine.backward(engine(input_ids=ids, labels=ids).loss * math.nan)
engine.step()
guard, stopped = DivergenceGuard(10, 64), None
try:
    if not engine.optimizer.overflow:  # as finetune's Trainer: a step DeepSpeed skipped is not noted
        guard.observe_gradient_norm(1, engine.get_global_grad_norm())
    guard.check_observed()
except Diverged as error:
    stopped = str(error)
print(json.dumps({"skipped": bool(engine.optimizer.overflow), "stopped": stopped,
                  "weights_finite": all(p.isfinite().all().item() for p in engine.module.parameters())}))
"""
)


@pytest.mark.integration
@pytest.mark.parametrize("profile", ["zero1", "zero2", "zero2_offload"])
def test_under_bf16_the_shipped_zero1_and_zero2_take_a_nan_step_and_the_guard_stops_at_it(profile):
    """Their JSON (and zero2_offload's) turn DeepSpeed's bf16 overflow check off (a host sync and six
    kernels per gradient partition every step): a NaN gradient is then stepped, as under ddp and fsdp,
    and stops the run."""
    nan_step = one_process_script(NAN_STEP_SCRIPT, profile, "null")
    assert nan_step == {"skipped": False, "stopped": "diverged at step 1: gradient norm inf",
                        "weights_finite": False}  # fmt: skip


@pytest.mark.integration
def test_with_deepspeeds_bf16_overflow_check_on_a_nan_step_is_skipped_unseen():
    """What the check bought: the step is dropped and nothing stops (a NaN loss stops the run only
    where it is logged)."""
    nan_step = one_process_script(NAN_STEP_SCRIPT, "zero2", "true")
    assert nan_step == {"skipped": True, "stopped": None, "weights_finite": True}
