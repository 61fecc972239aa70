"""`finetune` command line: the commands below, each with its own --help.

Before a run, `profiles`, `plan` and `doctor` say what fits and whether the machine is ready; `run`,
`compare` and `slurm` launch finetune/run.py under a profile; `export`, `eval` and `generate` work
on what a run leaves behind.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

from finetune.commands import compare, evaluate, export, generate, plan, profiles, run, slurm
from finetune.commands.shared import CommandParser
from finetune.errors import FinetuneError, exit_on_user_error
from finetune.resolve import pin_data_dir


@dataclass(frozen=True)
class Command:
    """A `finetune` command: the function that registers its parser and the one that runs it.

    A command that takes run flags gets what its own parser left (`run_args`) and reads it with
    finetune/run.py's parser; the others refuse any flag they do not declare.
    """

    register: Callable[[argparse._SubParsersAction], None]
    execute: Callable[..., int]
    takes_run_flags: bool = False


COMMANDS = {
    "profiles": Command(profiles.add_parser, profiles.execute),
    "run": Command(run.add_run_parser, run.run_command, takes_run_flags=True),
    "compare": Command(compare.add_parser, compare.execute, takes_run_flags=True),
    "slurm": Command(slurm.add_parser, slurm.execute, takes_run_flags=True),
    "doctor": Command(run.add_doctor_parser, run.doctor_command, takes_run_flags=True),
    "plan": Command(plan.add_parser, plan.execute, takes_run_flags=True),
    "export": Command(export.add_parser, export.execute),
    "eval": Command(evaluate.add_parser, evaluate.execute),
    "generate": Command(generate.add_parser, generate.execute),
}


MODEL_FIRST = ("eval", "generate")  # the model is their positional argument; `run` names it --model


def unrecognized(command: str, rest: list[str]) -> str:
    """The error for flags a command does not declare, pointing at that command's help; `--model`,
    which `run` taught, named where the command takes the model as its first argument."""
    if command in MODEL_FIRST and "--model" in rest:
        return (
            f"`finetune {command}` takes the model as its first argument, not --model: "
            f"finetune {command} MODEL ..."
        )
    return f"unrecognized arguments: {' '.join(rest)} (`finetune {command} --help` lists the flags)"


def make_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="finetune", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    with exit_on_user_error():
        argv = sys.argv[1:] if argv is None else argv
        if not argv:
            raise FinetuneError(f"name a command: {', '.join(COMMANDS)} (`finetune --help` says more)")
        parser = make_parser()
        options, rest = parser.parse_known_args(argv)
        if rest[:1] == ["--"]:  # `finetune slurm ... -- <run flags>`: the separator is not a run flag
            rest = rest[1:]
        command = COMMANDS[options.command]
        if rest and not command.takes_run_flags:
            raise FinetuneError(unrecognized(options.command, rest))
        pin_data_dir()  # before any child environment is built from os.environ
        return command.execute(options, rest) if command.takes_run_flags else command.execute(options)
    return 0
