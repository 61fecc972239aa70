"""Two `accelerate launch` processes acting as two machines (one rank each, gloo over loopback)
train together, and end with exactly the weights of one machine running both ranks."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from finetune.launch import resolved_profile_file
from finetune.profiles import load_profile
from finetune.summary import read_summary

from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, PROJECT_ROOT, TINY_MODEL, accelerate_launch, launch

pytestmark = pytest.mark.integration

FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "64", "--max_steps", "6",
    "--batch_size", "4", "--learning_rate", "3e-3", "--max_eval_samples", "8", "--save_strategy", "no",
    "--report_to", "none", "--disable_tqdm", "true",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_machines(profile: str, output_dir: Path, logs: Path, cwd: Path) -> None:
    """Machine ranks 0 and 1 on this host, each an accelerate launch with one process, started in `cwd`."""
    port = free_port()
    machines = []
    config = resolved_profile_file(load_profile(profile), logs)  # its DeepSpeed JSON named absolutely
    for rank in (0, 1):
        command = accelerate_launch(profile)
        command[command.index("--config_file") + 1] = str(config)
        script = command.index("finetune/run.py")
        command[script] = str(PROJECT_ROOT / "finetune/run.py")
        placement = ["--num_machines", "2", "--machine_rank", str(rank),
                     "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]  # fmt: skip
        command = [*command[:script], *placement, *command[script:], *FLAGS, "--output_dir", str(output_dir)]
        with (logs / f"machine{rank}.log").open("w") as log:
            machines.append(subprocess.Popen(command, cwd=cwd, env=ENVIRONMENT, stdout=log, stderr=log))
    for rank, machine in enumerate(machines):
        assert machine.wait(timeout=LAUNCH_TIMEOUT_S) == 0, (logs / f"machine{rank}.log").read_text()[-4000:]


@pytest.mark.parametrize("profile", ["zero3"])  # sharded state across launchers; ddp and fsdp add nothing
def test_two_machines_train_as_one_machine_with_two_ranks(profile, tmp_path):
    one, two = tmp_path / "one-machine", tmp_path / "two-machines"
    launch(accelerate_launch(profile), one, FLAGS)
    working_directory = tmp_path / "cwd"
    working_directory.mkdir()
    two_machines(profile, two, tmp_path, working_directory)
    assert list(working_directory.iterdir()) == []  # no .deepspeed_env with the launching shell's variables
    summary = read_summary(two)
    assert summary["world_size"] == 2
    assert [rank["steps"] for rank in summary["ranks"]] == [6, 6]
    expected, actual = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0, msg=name)
