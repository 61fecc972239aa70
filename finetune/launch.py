"""The `accelerate launch` command line for running finetune/run.py under a profile.

Shared by `finetune run` (one profile) and `finetune compare` (one after another). The command is
`python -m finetune.launch`: accelerate launch in that process, with a user error reported as one line
and exit 2 instead of the launcher's traceback and exit 1 (see `run_launcher`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from accelerate.utils import patch_environment

from finetune.errors import (
    CHECK_FAILED_EXIT_CODE,
    DIVERGED_EXIT_CODE,
    ERROR_FILE_VARIABLE,
    INTERRUPTED_EXIT_CODE,
    RESUMABLE_EXIT_CODE,
    FinetuneError,
    exit_on_user_error,
)
from finetune.profiles import Profile
from finetune.quiet import WithoutMessage

RUN_SCRIPT = Path(__file__).resolve().parent / "run.py"
DOCTOR_SCRIPT = RUN_SCRIPT.with_name("doctor.py")
# accelerate's DeepSpeed multi-node launchers (pdsh and the like) append every variable of the
# launching shell, tokens included, to this file in the working directory for the remote nodes.
DEEPSPEED_ENV_FILE_VARIABLE = "DS_ENV_FILE"
FREE_PORT = 0  # accelerate launch --main_process_port 0: a port the operating system says is free
# A profile's torch.compile settings (its dynamo_config) as the variables the ranks' accelerate reads,
# which accelerate launch sets for its other launchers, not DeepSpeed's (deepspeed_dynamo_environment)
DYNAMO_VARIABLES = {
    "dynamo_backend": "ACCELERATE_DYNAMO_BACKEND",
    "dynamo_mode": "ACCELERATE_DYNAMO_MODE",
    "dynamo_use_fullgraph": "ACCELERATE_DYNAMO_USE_FULLGRAPH",
    "dynamo_use_dynamic": "ACCELERATE_DYNAMO_USE_DYNAMIC",
    "dynamo_use_regional_compilation": "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
}


@dataclass
class Placement:
    """Where the processes go: accelerate launch's own multi-process and multi-machine options."""

    num_processes: int | None = field(
        default=None, metadata={"help": "processes in all (default: every visible GPU)"}
    )
    num_machines: int | None = field(default=None, metadata={"help": "machines (nodes) taking part"})
    machine_rank: int | None = field(default=None, metadata={"help": "this machine's rank among them"})
    main_process_ip: str | None = field(default=None, metadata={"help": "address of machine rank 0"})
    main_process_port: int | None = field(default=None, metadata={"help": "port on machine rank 0"})

    def __post_init__(self) -> None:
        """Counts and a port that accelerate launch takes and then fails on, refused in one line: a
        process count below 1 is its assertion's traceback, a port out of range a socket's."""
        for flag in ("num_processes", "num_machines"):
            value = getattr(self, flag)
            if value is not None and value < 1:
                raise FinetuneError(f"--{flag} must be at least 1, got {value}")
        if self.main_process_port is not None and not 0 <= self.main_process_port <= 65535:
            raise FinetuneError(
                f"--main_process_port must be from 0 (a free one) to 65535, got {self.main_process_port}"
            )

    def check_for(self, profile: Profile) -> None:
        """What only the profile tells: whether it starts several processes, and on how many machines
        (a copied profile may name them). A machine rank that cannot join waits in torch's
        rendezvous forever; processes that machines cannot share equally are silently fewer."""
        if not profile.multi_process:
            given = [f"--{name} {value}" for name, value in vars(self).items() if value not in (None, 1)]
            if given:
                raise FinetuneError(
                    f"{', '.join(given)}: profile {profile.name} runs one process on this machine "
                    "(ddp and the other profiles run several)"
                )
            return
        machines = self.num_machines or profile.settings.get("num_machines", 1)
        rank = self.machine_rank if self.machine_rank is not None else profile.settings.get("machine_rank", 0)
        if not 0 <= rank < machines:
            raise FinetuneError(
                f"--machine_rank {rank}: must be from 0 to {machines - 1} of {machines} machine(s)"
            )
        if self.num_processes is not None and self.num_processes % machines:
            raise FinetuneError(
                f"--num_processes {self.num_processes} is not a multiple of the {machines} machines: "
                "each machine starts an equal share"
            )

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


def on_one_machine(profile: Profile, placement: Placement) -> bool:
    """Whether the run stays on this machine with no port of the profile's: such runs take a free port,
    as accelerate's fixed default (29500) makes a second run on the same machine fail."""
    machines = placement.num_machines or profile.settings.get("num_machines", 1)
    return machines == 1 and "main_process_port" not in profile.settings


def default_num_processes() -> int:
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise FinetuneError("no GPU is visible: pass --num_processes N to run N CPU processes (gloo)")
    return gpus


def launch_command(
    profile: Profile, config_file: Path, placement: Placement, run_args: list[str], script: Path = RUN_SCRIPT
) -> list[str]:
    placement.check_for(profile)
    command = [sys.executable, "-m", "finetune.launch", "--config_file", str(config_file)]
    if profile.multi_process:
        if placement.num_processes is None:
            placement.num_processes = default_num_processes()
        if placement.main_process_port is None and on_one_machine(profile, placement):
            placement.main_process_port = FREE_PORT
        command += placement.flags()
    return [*command, str(script), *run_args]


@contextmanager
def private_deepspeed_env_file(folder: Path) -> Iterator[None]:
    """Point DeepSpeed's environment file into the launch's private folder (removed with it).

    DeepSpeed reads the name from `$DS_ENV_FILE` when its runner is imported, and accelerate imports
    the name from there when it writes the file; both are set so neither the launcher (this process)
    nor the runner it starts writes or reads `.deepspeed_env` in the user's working directory.
    """
    path = str(folder / "deepspeed_env")
    runner = sys.modules.get("deepspeed.launcher.runner")
    before = getattr(runner, "DEEPSPEED_ENVIRONMENT_NAME", None)
    if runner is not None:
        runner.DEEPSPEED_ENVIRONMENT_NAME = path
    try:
        with patch_environment(**{DEEPSPEED_ENV_FILE_VARIABLE: path}):
            yield
    finally:
        if runner is not None:
            runner.DEEPSPEED_ENVIRONMENT_NAME = before


def deepspeed_dynamo_environment(config_file: str | None) -> dict[str, str]:
    """The variables a DeepSpeed profile's `dynamo_config` stands for, which accelerate launch drops.

    accelerate's multi-GPU and FSDP launchers set ACCELERATE_DYNAMO_* from the config file; its
    DeepSpeed launcher (`prepare_deepspeed_cmd_env` in accelerate 1.15) sets none, so a DeepSpeed
    profile asking for regional compilation would silently compile the whole model. Set here the
    way the multi-GPU launcher sets them; a plain `accelerate launch` still drops them
    (docs/profiles.md).
    """
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    if config_file is None:
        return {}
    config = load_config_from_file(config_file)  # accelerate's reader: its own error for a bad file
    if config.distributed_type != DistributedType.DEEPSPEED:
        return {}
    dynamo = config.dynamo_config or {}
    return {
        variable: str(dynamo[key]).upper() if key == "dynamo_backend" else str(dynamo[key])
        for key, variable in DYNAMO_VARIABLES.items()
        if key in dynamo
    }


def run_launcher(argv: list[str]) -> int:
    """`accelerate launch ARGV` in this process, returning the exit code the job should end with.

    accelerate launch ends any failed rank with its own traceback (torch elastic's ChildFailedError,
    or CalledProcessError for one process) and exit 1. Here the ranks write a user error to the file
    `$FINETUNE_ERROR_FILE` names (finetune/errors.py) and it is raised again as one FinetuneError; any
    other failure ends with the failed rank's exit code and one line saying which rank it was.
    """
    from accelerate.commands.launch import launch_command as accelerate_launch
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(argv)
    # torch elastic logs every failed rank and the stopping of the others; the line below replaces that
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    # and that a signal stops the ranks: the ranks' own line says how the run stopped, and with what
    logging.getLogger("torch.distributed.elastic.agent.server.api").addFilter(
        WithoutMessage("death signal, shutting down workers")
    )
    with tempfile.TemporaryDirectory(prefix="finetune-launch-") as folder:
        error_file = Path(folder) / "error"
        try:
            # torchrun sets one OpenMP thread per rank where none is set, in a four-line banner
            threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
            with (
                patch_environment(
                    **{ERROR_FILE_VARIABLE: str(error_file)},
                    **threads,
                    **deepspeed_dynamo_environment(args.config_file),
                ),
                private_deepspeed_env_file(Path(folder)),
            ):
                accelerate_launch(args)
            return 0
        except ChildFailedError as failure:
            rank, first = failure.get_first_failure()
            code = shell_exit_code(first.exitcode)
            who = f"rank {rank}"
        except subprocess.CalledProcessError as failure:  # one process, run as a plain subprocess
            code = shell_exit_code(failure.returncode)
            who = "the training process"
        except SignalException as stop:
            code, who = 128 + stop.sigval, f"the launcher, on {stop.sigval.name},"
        if error_file.exists():
            raise FinetuneError(error_file.read_text(encoding="utf-8").strip())
    if code not in (RESUMABLE_EXIT_CODE, INTERRUPTED_EXIT_CODE, DIVERGED_EXIT_CODE, CHECK_FAILED_EXIT_CODE):
        print(
            f"finetune: {who} stopped with {exit_code_meaning(code)} (its output is above)", file=sys.stderr
        )
    return code


def shell_exit_code(code: int) -> int:
    """A failed process's code as the shell gives it: Python's subprocesses and torch's elastic agent
    report a process killed by signal N as -N, the shell as 128 + N."""
    return code if code > 0 else 128 - code


def exit_code_meaning(code: int) -> str:
    """The exit code as the shell gives it, the signal it stands for above 128 named: a rank killed
    outright leaves no line of its own, and SIGKILL is how the kernel ends one when host memory runs
    out."""
    try:
        name = signal.Signals(code - 128).name if code > 128 else None
    except ValueError:
        name = None
    if name is None:
        return f"exit code {code}"
    if name == "SIGKILL":
        return f"exit code {code} ({name}: out of host memory, most often, or a job limit)"
    return f"exit code {code} ({name})"


def main(argv: list[str] | None = None) -> int:
    with exit_on_user_error():
        return run_launcher(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
