"""`finetune profiles`: every profile's strategy, fastest first, checked; `--copy` an editable one."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from finetune.errors import FinetuneError
from finetune.profiles import (
    available_profiles,
    copy_profile,
    fastest_first,
    load_profile,
)


@dataclass
class ProfilesFlags:
    files: list[str] = field(
        default_factory=list,
        metadata={"positional": True, "help": "profile YAML files to check (default: the shipped profiles)"},
    )
    copy: list[str] | None = field(
        default=None,
        metadata={
            "nargs": 2,
            "metavar": ("NAME", "DIR"),
            "help": "write an editable copy of profile NAME (its YAML and DeepSpeed JSON) into DIR",
        },
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "profiles", help="list the strategy profiles and validate them", dataclass_types=[ProfilesFlags]
    )


def execute(args: argparse.Namespace) -> int:
    """Print every profile's strategy, fastest first; a broken one prints its error and fails the command.

    With --copy, write an editable copy of one profile instead.
    """
    if args.copy:
        if args.files:
            raise FinetuneError("give profile files to check or --copy NAME DIR, not both")
        name, folder = args.copy
        copies = copy_profile(name, Path(folder))
        print(f"finetune: wrote {' and '.join(str(path) for path in copies)}; edit them, then run from here:")
        print(f"    finetune run --profile {copies[0]} [run flags]")
        return 0
    failures = 0
    strategies = []
    for path in [Path(p) for p in args.files] if args.files else available_profiles():
        try:
            strategies.append(load_profile(path).strategy)
        except FinetuneError as error:
            failures += 1
            print(f"finetune: error: {error}", file=sys.stderr)
    for strategy in fastest_first(strategies):
        print(f"{strategy.name:<15} {strategy.summary}")
    return 1 if failures else 0
