"""What several commands share: run flags read as run.py reads them, where the ranks go, and
argparse value types that name what they expect."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

from finetune.errors import FinetuneError
from finetune.launch import Placement
from finetune.profiles import (
    Strategy,
    shipped_strategies,
)
from finetune.run_flags import DataArguments, ModelArguments

if TYPE_CHECKING:
    from finetune.arguments import FinetuneTrainingArguments


T = TypeVar("T")
PLACEMENT_OPTIONS = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")


def placement_of(options: argparse.Namespace) -> Placement:
    return Placement(**{name: getattr(options, name) for name in PLACEMENT_OPTIONS})


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the ranks go (Placement): `finetune run`'s and `finetune doctor`'s, passed to accelerate."""
    parser.add_argument("--num_processes", type=int, help="processes in all (default: every visible GPU)")
    parser.add_argument("--num_machines", type=int, help="machines (nodes) taking part")
    parser.add_argument("--machine_rank", type=int, help="this machine's rank among them")
    parser.add_argument("--main_process_ip", help="address of machine rank 0")
    parser.add_argument("--main_process_port", type=int, help="port on machine rank 0")


def parse_run_flags(
    run_args: list[str], defaults: tuple[str, ...] = ()
) -> tuple[ModelArguments, DataArguments, FinetuneTrainingArguments]:
    """The run flags (a recipe first, if any) as finetune/run.py will read them, with the same parser.

    `defaults` are flags placed before the recipe's, so that the recipe and the command line override
    them. A mistake in the run flags stops the command here, before anything is launched.
    """
    from finetune.arguments import expand_recipe, parse_arguments
    from finetune.converters import refuse_incompatible

    model_args, data_args, training_args = parse_arguments([*defaults, *expand_recipe(run_args)])
    refuse_incompatible(model_args, training_args)  # the flags alone; run.py checks the launch too
    return model_args, data_args, training_args


def names(strategies: list[Strategy]) -> str:
    return ", ".join(strategy.name for strategy in strategies)


def shipped_for_help() -> list[Strategy]:
    """The shipped strategies the help lists; none where a profile cannot be read (a broken
    ds_configs/ in the working directory), so that every command still parses and reports it."""
    try:
        return shipped_strategies()
    except FinetuneError:
        return []


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise ValueError(text)
    return value


positive_int.__name__ = "positive int"  # argparse names the type in its message: "invalid positive int value"

positive_float.__name__ = "positive number"

fraction.__name__ = "fraction (0 to below 1)"


EVAL_DATA_FLAGS = ("dataset", "text_column", "data_format")


def flags_into(declared_by: type[T], options: argparse.Namespace, **given: Any) -> T:
    """A dataclass of the command's work made from the parsed flags of the same names, with `given`
    for the fields no flag of that name sets: each flag is named once, by its field."""
    named = {
        field.name: getattr(options, field.name)
        for field in fields(declared_by)
        if hasattr(options, field.name)
    }
    return declared_by(**{**named, **given})
