"""Launching real training runs from tests: the command lines, environment and time limit they share."""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.launch import FREE_PORT

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# A GPT-2 with a byte-level vocabulary of 257 (tests/data/README.md): GPT-2's 50,257 made the output layer
# most of every launched step.
BYTE_GPT2 = PROJECT_ROOT / "tests" / "data" / "byte-gpt2"
ENVIRONMENT = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# Runs started outside the checkout find the data too (CI passes a relative ../shared/data).
if "FINETUNE_DATA_DIR" in os.environ:
    ENVIRONMENT["FINETUNE_DATA_DIR"] = str(Path(os.environ["FINETUNE_DATA_DIR"]).resolve())
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
TINY_MODEL = [
    "--model", str(BYTE_GPT2), "--from_scratch", "--config_overrides", "n_layer=2,n_embd=64,n_head=2"
]  # fmt: skip
LAUNCH_TIMEOUT_S = 900


def accelerate_launch(profile: str, num_processes: int = 2, script: str = "finetune/run.py") -> list[str]:
    """With a free port, as `finetune run` takes one: pytest-xdist's workers launch runs at the same time.
    `script` may be one of the tests' wrappers of finetune/run.py (tests/paced_run.py)."""
    config = f"accelerate_configs/{profile}.yaml"
    return [
        *ACCELERATE, "--config_file", config, "--num_processes", str(num_processes),
        "--main_process_port", str(FREE_PORT), script,
    ]  # fmt: skip


def launch(
    command: list[str], output_dir: Path, flags: list[str], cwd: Path = PROJECT_ROOT
) -> subprocess.CompletedProcess[str]:
    """Run to the end (from the project root unless told); a non-zero exit fails the test with the run's
    output."""
    result = subprocess.run(
        [*command, *flags, "--output_dir", str(output_dir)],
        cwd=cwd,
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )
    assert result.returncode == 0, f"run failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def nvme_flags(profile: str, output_dir: Path) -> list[str]:
    """zero3_nvme requires --nvme_path: each run swaps into a folder of its own beside its output_dir."""
    if profile != "zero3_nvme":
        return []
    skip_without_async_io()
    return ["--nvme_path", str(output_dir.with_name(f"{output_dir.name}-nvme"))]


@functools.cache
def async_io_problem() -> str | None:
    """Why DeepSpeed's async I/O op (zero3_nvme's swapping) cannot be built here, or None if it can.

    Asked of DeepSpeed itself, in a process of its own: the check needs its CPU accelerator chosen
    before DeepSpeed is imported. $FINETUNE_TESTS_WITHOUT_NVME (a reason) leaves these runs out: CI's
    second venv does when its DeepSpeed is the version the first one's suite ran them with.
    """
    if reason := os.environ.get("FINETUNE_TESTS_WITHOUT_NVME"):
        return reason
    probe = "from deepspeed.ops.op_builder.cpu import AsyncIOBuilder; print(AsyncIOBuilder().is_compatible())"
    environment = {**ENVIRONMENT, "DS_ACCELERATOR": "cpu"}
    result = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, text=True)
    if result.stdout.strip().endswith("True"):
        return None
    return "DeepSpeed's async I/O op cannot be built: zero3_nvme needs libaio (apt-get install libaio-dev)"


def skip_without_async_io() -> None:
    if problem := async_io_problem():
        pytest.skip(problem)


def resolve_and_set_up(training_args, launch) -> None:
    """What run.py applies to parsed flags before training: the launch's choices, then the devices."""
    from finetune.launch_settings import resolve_launch_settings, set_up_devices

    resolve_launch_settings(training_args, launch)
    set_up_devices(training_args, launch)


def undo_what_commands_install(patch: pytest.MonkeyPatch) -> None:
    """A command run in this process installs restricted checkpoint readers process-wide
    (finetune.checkpoint.load_weights_only); with `patch` undone, later tests get torch.load and DCP's
    metadata reader as they were."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    patch.setattr(torch, "load", torch.load)
    patch.setattr(FileSystemReader, "read_metadata", FileSystemReader.read_metadata)
    patch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0")


ONE_GLOO_PROCESS = """
import os, sys, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
dist.init_process_group("gloo")
"""
# For a script of `one_process_script`: a two-layer GPT-2 under a DeepSpeed engine built from a config
# (micro batch 2), and a batch of token ids for it.
TINY_DEEPSPEED_ENGINE = """
import torch, deepspeed
from transformers import GPT2Config, GPT2LMHeadModel, set_seed
def tiny_gpt2_engine(config):
    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    optimizer = torch.optim.AdamW(model.parameters())
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, torch.randint(0, 64, (2, 16))
"""
WITHOUT_TEARDOWN = """
from finetune.run import exit_without_teardown
exit_without_teardown(lambda: None)  # gloo's teardown at exit can abort under load, as a rank's can
"""


def one_process_script(script: str, *args: str) -> object:
    """`script` run by a new Python in a gloo group of one process (`args` from sys.argv[2]), its result
    the JSON it prints last: DeepSpeed's engines and zero.Init set up process groups and globals a
    test's own process must not keep."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    whole = ONE_GLOO_PROCESS + script + WITHOUT_TEARDOWN
    done = subprocess.run(
        [sys.executable, "-c", whole, str(port), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
