"""The `accelerate launch` command line for running finetune/run.py under a profile.

Shared by `finetune run` (one profile) and `finetune compare` (one after another).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from finetune.errors import FinetuneError
from finetune.profiles import Profile

RUN_SCRIPT = Path(__file__).resolve().parent / "run.py"


@dataclass
class Placement:
    """Where the processes go: accelerate launch's own multi-process and multi-machine options."""

    num_processes: int | None = None
    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None

    def flags(self) -> list[str]:
        flags = []
        for name, value in vars(self).items():
            if value is not None:
                flags += [f"--{name}", str(value)]
        return flags


def resolved_profile_file(profile: Profile, folder: Path) -> Path:
    """A copy of the profile with an absolute DeepSpeed JSON path, so runs work from any directory."""
    settings = dict(profile.settings)
    if profile.deepspeed_config_path is not None:
        settings["deepspeed_config"] = {
            **settings["deepspeed_config"],
            "deepspeed_config_file": str(profile.deepspeed_config_path),
        }
    path = folder / f"{profile.name}.yaml"
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return path


def default_num_processes() -> int:
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise FinetuneError("no GPU is visible: pass --num_processes N to run N CPU processes (gloo)")
    return gpus


def launch_command(
    profile: Profile, config_file: Path, placement: Placement, run_args: list[str]
) -> list[str]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file)]
    if profile.multi_process:
        if placement.num_processes is None:
            placement.num_processes = default_num_processes()
        command += placement.flags()
    return [*command, str(RUN_SCRIPT), *run_args]
