"""`finetune compare`: several profiles (and training variants) on one model, one table."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from finetune.commands.shared import PositiveFloat, PositiveInt, parse_run_flags
from finetune.launch import Placement
from finetune.profiles import load_profile


@dataclass
class CompareFlags:
    profiles: str | None = field(
        default=None,
        metadata={
            "help": "comma-separated profile names or YAML files (default: every multi-process profile, "
            "fastest first; the NVMe one only with --nvme_path)"
        },
    )
    num_processes: PositiveInt | None = field(
        default=None, metadata={"aliases": ["--gpus"], "help": "processes per run (default: GPUs)"}
    )
    output_dir: str = field(
        default="outputs/compare", metadata={"help": "a new folder per run in it; earlier ones are kept"}
    )
    timeout: PositiveFloat = field(default=1800, metadata={"help": "seconds before a run is stopped"})
    variants: str | None = field(
        default=None,
        metadata={
            "help": "training variants each profile runs in, comma-separated: full (every weight), lora, "
            "dora (as run.py's --peft); e.g. full,lora to answer full or LoRA, on which profile (default: "
            "as the run flags say)"
        },
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "compare",
        help="run several profiles on one model, one table",
        description="Flags not listed here go to every run, as to `finetune run`: --model, a recipe first, "
        "... (see `python -m finetune.run --help`).",
        dataclass_types=[CompareFlags],
    )


def execute(options: argparse.Namespace, run_args: list[str]) -> int:
    from finetune.arguments import expand_recipe
    from finetune.compare import (
        comma_separated,
        compare,
        default_profiles,
        training_variants,
        variant_flags,
    )
    from finetune.deepspeed_json import JsonDecidedFlags

    run_args = expand_recipe(run_args)  # every run's own flags are added around these
    variants = training_variants(options.variants, run_args)
    for variant in variants:
        _, _, training_args = parse_run_flags([*run_args, *variant_flags(variant)])
    sequence_parallel = training_args.sequence_parallel
    if options.profiles is not None:
        profiles = comma_separated("--profiles", options.profiles)
    else:
        import torch

        profiles = default_profiles(run_args, sequence_parallel, torch.cuda.is_available())
    for name in profiles:
        load_profile(name)
    command_line = " ".join(["finetune", "compare", *sys.argv[2:]])
    rows = compare(
        profiles,
        Placement(num_processes=options.num_processes),
        run_args,
        Path(options.output_dir),
        options.timeout,
        command_line,
        **({"variants": tuple(variants)} if options.variants else {}),
        json_flags=JsonDecidedFlags.of(training_args),
    )
    print((Path(options.output_dir) / "comparison.md").read_text())
    return 0 if any(row.status == "completed" for row in rows) else 1
