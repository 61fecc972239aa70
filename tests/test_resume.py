"""Stop a real 2-process run, resume it, and get the run that was never stopped.

The uninterrupted run is the profile's reference run (tests/runs.py). Under each sharded profile a
copy of one of its middle checkpoints is resumed; under zero3 a run whose ranks all get SIGTERM (what
SLURM sends) saves, exits with the resumable code, and is resumed; under ddp a run whose rank 1 is
SIGKILLed after its first checkpoint is resumed. On CPU the kernels and gloo's reductions are
deterministic and the checkpoint restores model, optimizer, scheduler, RNG, data position and the
loss sum, so every resumed run must end with exactly the uninterrupted run's weights and train_loss.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from finetune import cli
from finetune.errors import RESUMABLE_EXIT_CODE
from finetune.run_folder import MANIFEST
from finetune.summary import read_summary

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, accelerate_launch, launch
from runs import CHECKPOINT_STEPS, FLAGS, MAX_STEPS, SAVE_STEPS, copy_checkpoint

pytestmark = pytest.mark.integration

PROFILES = ["ddp", "fsdp", "zero1", "zero2", "zero3", "zero3_nvme"]


def run(profile: str, output_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return launch(accelerate_launch(profile), output_dir, [*FLAGS, *extra])


def workers(launcher: subprocess.Popen) -> list[psutil.Process]:
    """The training ranks, in rank order: the launcher's own children with a RANK (the launcher is their
    parent; their own children, such as compiler processes, come and go while they are listed)."""
    ranks = []
    for child in psutil.Process(launcher.pid).children():
        try:
            ranks.append((int(child.environ()["RANK"]), child))
        except (psutil.NoSuchProcess, KeyError):
            continue
    return [process for _, process in sorted(ranks, key=lambda pair: pair[0])]


def start_and_wait_for_a_checkpoint(profile: str, output_dir: Path, log: Path) -> subprocess.Popen:
    """Paced (tests/paced_run.py), so the run still trains when the test stops it after this."""
    paced = accelerate_launch(profile, script="tests/paced_run.py")
    with log.open("w") as stream:
        launcher = subprocess.Popen(
            [*paced, *FLAGS, "--output_dir", str(output_dir)],
            cwd=PROJECT_ROOT, env=ENVIRONMENT, stdout=stream, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (output_dir / f"checkpoint-{SAVE_STEPS}" / MANIFEST).exists():
        assert launcher.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return launcher


def weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "model.safetensors")


def assert_same_weights(resumed: Path, straight: Path) -> None:
    expected = weights(straight)
    actual = weights(resumed)
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0, msg=name)


def assert_ends_as_the_uninterrupted_run(output_dir: Path, straight: Path) -> None:
    summary, expected = read_summary(output_dir), read_summary(straight)
    assert (summary["status"], summary["steps"]) == ("completed", MAX_STEPS)
    assert_same_weights(output_dir, straight)
    assert summary["eval_loss"] == expected["eval_loss"]
    assert summary["train_loss"] == expected["train_loss"]


@pytest.mark.parametrize("profile", ["fsdp", "zero2"])
def test_resume_from_a_middle_checkpoint_ends_with_the_uninterrupted_weights(
    profile, reference_run, tmp_path
):
    """zero3 and ddp resume below, after a stop."""
    straight = reference_run(profile)
    output_dir = tmp_path / "out"
    copy_checkpoint(straight, output_dir, CHECKPOINT_STEPS[1])
    run(profile, output_dir, "--resume")
    assert read_summary(output_dir)["resumed_from_step"] == CHECKPOINT_STEPS[1]
    assert_ends_as_the_uninterrupted_run(output_dir, straight)


def test_killed_rank_then_resume_ends_with_the_uninterrupted_weights(reference_run, tmp_path):
    output_dir = tmp_path / "out"
    launcher = start_and_wait_for_a_checkpoint("ddp", output_dir, tmp_path / "killed.log")
    ranks = workers(launcher)
    assert len(ranks) == 2
    ranks[1].kill()
    assert launcher.wait(timeout=LAUNCH_TIMEOUT_S) != 0
    resumed = run("ddp", output_dir, "--resume")
    assert "missing keys" not in resumed.stderr  # GPT-2's tied lm_head, stored once, is no news
    assert read_summary(output_dir)["resumed_from_step"] >= SAVE_STEPS
    assert_ends_as_the_uninterrupted_run(output_dir, reference_run("ddp"))


def test_sigterm_saves_exits_resumable_and_resume_ends_with_the_uninterrupted_weights(
    reference_run, tmp_path
):
    """Every rank gets SIGTERM twice, as when SLURM signals the job's processes and the launcher
    forwards its own: one save, one stop."""
    output_dir = tmp_path / "out"
    log = tmp_path / "stopped.log"
    launcher = start_and_wait_for_a_checkpoint("zero3", output_dir, log)
    ranks = workers(launcher)
    assert len(ranks) == 2
    for rank in ranks:
        rank.send_signal(signal.SIGTERM)
        rank.send_signal(signal.SIGTERM)
    launcher.wait(timeout=LAUNCH_TIMEOUT_S)
    stopped = read_summary(output_dir)
    # the ranks' exit codes, as the launcher reports them
    assert set(re.findall(r"exitcode\s*:\s*(\d+)", log.read_text())) == {str(RESUMABLE_EXIT_CODE)}
    assert stopped["status"] == "interrupted"
    assert stopped["error"].startswith("stopped by SIGTERM")
    assert stopped["checkpoint"] == str(output_dir / f"checkpoint-{stopped['steps']}")
    run("zero3", output_dir, "--resume")
    assert read_summary(output_dir)["resumed_from_step"] == stopped["steps"]
    assert_ends_as_the_uninterrupted_run(output_dir, reference_run("zero3"))


@pytest.mark.parametrize("profile", PROFILES)
def test_export_of_the_final_checkpoint_gives_the_trained_models_logits(
    profile, reference_run, tmp_path, in_process_commands
):
    """The exported model is compared in a fresh process that never imports DeepSpeed: using it needs
    nothing but transformers."""
    straight = reference_run(profile)
    export = tmp_path / "export"
    checkpoint = straight / f"checkpoint-{MAX_STEPS}"
    assert cli.main(["export", str(checkpoint), str(export)]) == 0
    probe = (
        "import sys, torch; from transformers import AutoModelForCausalLM as M; "
        "x = torch.arange(100, 164).reshape(2, 32); "
        "a, b = (M.from_pretrained(p).eval()(x).logits for p in sys.argv[1:3]); "
        "assert 'deepspeed' not in sys.modules; print((a - b).abs().max().item())"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(export), str(straight)],
        env=ENVIRONMENT, check=True, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert float(result.stdout.strip().splitlines()[-1]) <= 1e-5
