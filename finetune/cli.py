"""`finetune` command line: list/validate profiles, and launch a run under a profile."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from finetune.errors import FinetuneError, exit_on_user_error
from finetune.profiles import Profile, available_profiles, load_profile

RUN_SCRIPT = Path(__file__).resolve().parent / "run.py"
LAUNCH_OPTIONS = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")


def profiles_command(args: argparse.Namespace) -> int:
    """Print every profile with its description; a broken one prints its error and fails the command."""
    failures = 0
    paths = [Path(p) for p in args.files] if args.files else available_profiles()
    for path in paths:
        try:
            profile = load_profile(path)
        except FinetuneError as error:
            failures += 1
            print(f"finetune: error: {error}", file=sys.stderr)
            continue
        print(f"{profile.name:<15} {profile.description}")
    return 1 if failures else 0


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
    profile: Profile, config_file: Path, options: argparse.Namespace, run_args: list[str]
) -> list[str]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file)]
    if profile.multi_process:
        if options.num_processes is None:
            options.num_processes = default_num_processes()
        for name in LAUNCH_OPTIONS:
            value = getattr(options, name)
            if value is not None:
                command += [f"--{name}", str(value)]
    return [*command, str(RUN_SCRIPT), *run_args]


def run_command(options: argparse.Namespace, run_args: list[str]) -> int:
    profile = load_profile(options.profile)
    with tempfile.TemporaryDirectory(prefix="finetune-profile-") as folder:
        command = launch_command(profile, resolved_profile_file(profile, Path(folder)), options, run_args)
        print("finetune: " + " ".join(command), file=sys.stderr)
        environment = {**os.environ, "FINETUNE_PROFILE": profile.name}
        return subprocess.call(command, env=environment)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    profiles = commands.add_parser("profiles", help="list the strategy profiles and validate them")
    profiles.add_argument(
        "files", nargs="*", help="profile YAML files to check (default: accelerate_configs/*.yaml)"
    )

    run = commands.add_parser(
        "run",
        help="launch finetune/run.py under a profile with accelerate launch",
        description="Any flag not listed here goes to finetune/run.py (see `python finetune/run.py --help`).",
    )
    run.add_argument("--profile", required=True, help="profile name (see `finetune profiles`) or YAML file")
    run.add_argument("--num_processes", type=int, help="processes in all (default: every visible GPU)")
    run.add_argument("--num_machines", type=int, help="machines (nodes) taking part")
    run.add_argument("--machine_rank", type=int, help="this machine's rank among them")
    run.add_argument("--main_process_ip", help="address of machine rank 0")
    run.add_argument("--main_process_port", type=int, help="port on machine rank 0")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    options, rest = parser.parse_known_args(argv)
    with exit_on_user_error():
        if options.command == "profiles":
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            return profiles_command(options)
        return run_command(options, rest)
    return 0
