"""`finetune run` and `finetune doctor`: finetune/run.py (or doctor.py) on the ranks a profile asks
for, through accelerate launch; a stop signal passed on to the ranks; `--profile auto` planned."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from finetune.commands.shared import (
    names,
    parse_run_flags,
    placement_of,
    shipped_for_help,
)
from finetune.deepspeed_json import JsonDecidedFlags
from finetune.errors import RESUMABLE_EXIT_CODE, FinetuneError
from finetune.launch import DOCTOR_SCRIPT, RUN_SCRIPT, Placement, launch_command, resolved_profile_file
from finetune.launched import PROFILE_VARIABLE, precision_on, visible_gpu_supports_bf16
from finetune.layout import ParallelLayout
from finetune.profiles import load_profile, with_shipped_recipe
from finetune.sequence_parallel import check_device, check_strategy

ORPHANED_RANKS_WAIT_S = 600.0  # a checkpoint of a large model takes minutes to write


@dataclass
class RunFlags:
    profile: str = field(
        metadata={
            "help": "profile name (`finetune profiles` lists them, fastest first), YAML file, or auto (the "
            "planner's pick)"
        }
    )
    doctor: bool = field(
        default=False,
        metadata={"help": "run `finetune doctor` first; train only if every check passes"},
    )


@dataclass
class DoctorFlags:
    profile: str = field(metadata={"help": "profile name or YAML file"})


def add_run_parser(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "run",
        help="launch finetune/run.py under a profile with accelerate launch",
        description="Any flag not listed here goes to finetune/run.py (see `python -m finetune.run --help`). "
        f"Profiles, fastest first: {names(shipped_for_help())}. Run flags may start with a recipe, a YAML "
        "file of them (`finetune run --profile single recipes/cpu_quickstart.yaml`): a path, or, where no "
        "such file exists, the shipped recipe of that file name.",
        dataclass_types=[RunFlags, Placement],
    )


def run_command(options: argparse.Namespace, run_args: list[str]) -> int:
    run_args = with_shipped_recipe(run_args)
    from finetune.outputs import check_claimable  # imports the Trainer: not for every command's start

    model_args, _, training_args = parse_run_flags(run_args)
    # refused here, before the launch folder is written into a folder that is not this run's
    check_claimable(
        Path(training_args.output_dir),
        training_args.resumes_a_run,
        training_args.overwrite_output_dir,
        model_args.folders_read(),
    )
    if options.profile == "auto":
        options.profile, reason = auto_profile(run_args, options.num_processes)
        print(f"finetune: --profile auto picked {options.profile}: {reason}", file=sys.stderr)
    profile = load_profile(options.profile)
    strategy, degree = profile.strategy, training_args.sequence_parallel
    JsonDecidedFlags.of(training_args).check(profile.deepspeed_config_path, profile.deepspeed_config)
    check_strategy(strategy, degree)
    check_device(strategy.sequence_split, degree, torch.cuda.is_available())  # runs here, on these GPUs
    if options.doctor:
        code = launch(options, run_args, DOCTOR_SCRIPT)
        if code != 0:
            print("finetune: --doctor: a check failed (the table above): no run started", file=sys.stderr)
            return code
    code = launch(options, run_args, RUN_SCRIPT, training_args.output_dir)
    if code < 0:  # the launcher was killed (kill -9): its ranks stop on their own and may have saved
        return orphaned_ranks_outcome(Path(training_args.output_dir), signal.Signals(-code))
    return code


def add_doctor_parser(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "doctor",
        help="check the machine for a run on the ranks the run would start: GPUs, collectives, DeepSpeed "
        "build locks, disk, model and data names; one table, exit 0 only if all pass",
        description="Takes `finetune run`'s placement flags and run flags (or a recipe).",
        dataclass_types=[DoctorFlags, Placement],
    )


def doctor_command(options: argparse.Namespace, run_args: list[str]) -> int:
    run_args = with_shipped_recipe(run_args)
    parse_run_flags(run_args)
    return launch(options, run_args, DOCTOR_SCRIPT)


def auto_profile(run_args: list[str], num_processes: int | None) -> tuple[str, str]:
    """The planner's pick for the model and batch the run flags (and their recipe) ask for."""
    from finetune.planner import choose_profile, run_workload, visible_gpu_memory_gib

    model_args, data_args, training_args = parse_run_flags(run_args)
    memory = visible_gpu_memory_gib()
    if memory is None:
        raise FinetuneError("--profile auto plans GPU memory, and no GPU is visible: name a profile")
    # torch_compile is None until the run applies its launch: planned per profile
    dtype = precision_on(training_args, visible_gpu_supports_bf16())
    shape, workload = run_workload(model_args, data_args, training_args, dtype)
    layout = ParallelLayout(num_processes or torch.cuda.device_count(), training_args.sequence_parallel)
    batch_given = {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
    } & training_args.batch_flags_given
    global_batch = None if batch_given else training_args.global_batch_size
    return choose_profile(shape, workload, layout, memory, global_batch)


def launch(
    options: argparse.Namespace, run_args: list[str], script: Path, output_dir: str | None = None
) -> int:
    """`script` (run.py or doctor.py) on the ranks the profile and placement ask for: the launcher's
    exit code, negative when the launcher itself was killed.

    The printed command runs again as it is: the profile copy it names (its DeepSpeed JSON made
    absolute) is kept in output_dir/.launch/, where it also records how the run was launched; where
    that folder cannot be written, a temporary copy is used and removed at the end.
    """
    profile = load_profile(options.profile)
    with contextlib.ExitStack() as stack:
        folder = kept_launch_folder(output_dir) or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="finetune-profile-"))
        )
        config_file = resolved_profile_file(profile, folder)
        command = launch_command(profile, config_file, placement_of(options), run_args, script)
        print("finetune: " + " ".join(command), file=sys.stderr)
        environment = {**os.environ, PROFILE_VARIABLE: profile.name}
        with subprocess.Popen(command, env=environment) as launcher, forwarding_stop_signals(launcher):
            try:
                code = launcher.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the launcher too: let it stop its ranks
                code = launcher.wait()
    return code


def kept_launch_folder(output_dir: str | None) -> Path | None:
    from finetune.run_folder import LAUNCH_DIR

    if output_dir is None:
        return None
    folder = Path(output_dir) / LAUNCH_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@contextlib.contextmanager
def forwarding_stop_signals(launcher: subprocess.Popen) -> Iterator[None]:
    """A stop signal sent to this process alone (`kill PID`) reaches the ranks, and this process waits.

    As torchrun and accelerate launch pass their signals on, this process passes SIGTERM and SIGUSR1 to
    the processes the launcher started (the ranks, which save a checkpoint at the next step end and exit
    75) and goes on waiting for the launcher, whose exit code is then the run's. Not to the launcher
    itself: torch elastic would stop its ranks after 30 s, maybe in the middle of a save. Before any
    rank exists, the launcher gets it. A signal sent to the whole process group (SLURM, Ctrl-C) reached
    the ranks already; the second copy is the same request to them.
    """

    def forward(signum: int, frame: object) -> None:
        try:
            ranks = psutil.Process(launcher.pid).children()
        except psutil.NoSuchProcess:
            return
        for process in ranks or [psutil.Process(launcher.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signum)

    previous = {number: signal.signal(number, forward) for number in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def orphaned_ranks_outcome(output_dir: Path, killed_by: signal.Signals) -> int:
    """The exit code of a run whose launcher was killed: 75 when its ranks saved a checkpoint and stopped
    (finetune/outputs.py makes ranks stop when their launcher dies), so that a requeue resumes.

    The ranks outlive the launcher for as long as their save takes: they are waited for through the
    output_dir lock rank 0 holds until it exits, then the run summary says what they did.
    """
    from finetune.outputs import read_holder
    from finetune.run_folder import LOCK_FILE
    from finetune.summary import read_summary

    deadline = time.monotonic() + ORPHANED_RANKS_WAIT_S
    while time.monotonic() < deadline:
        holder = read_holder(output_dir / LOCK_FILE)
        if holder is None or holder.is_gone():
            break
        time.sleep(0.5)
    try:
        summary = read_summary(output_dir)
    except (OSError, ValueError):
        summary = {}
    checkpoint = summary.get("checkpoint")
    if summary.get("status") == "interrupted" and checkpoint:
        print(
            f"finetune: the launcher was killed ({killed_by.name}); its ranks saved {checkpoint} and "
            "stopped: run the same command with --resume",
            file=sys.stderr,
        )
        return RESUMABLE_EXIT_CODE
    print(f"finetune: the launcher was killed ({killed_by.name}); no checkpoint was saved", file=sys.stderr)
    return 128 + killed_by
