"""What several commands share: run flags read as run.py reads them, where the ranks go, and
argparse value types that name what they expect."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from transformers import HfArgumentParser

from finetune.errors import FinetuneError, OneLineArgumentErrors
from finetune.launch import Placement
from finetune.profiles import (
    Strategy,
    shipped_strategies,
)
from finetune.run_flags import DataArguments, ModelArguments

if TYPE_CHECKING:
    from finetune.arguments import FinetuneTrainingArguments


T = TypeVar("T")


class CommandParser(OneLineArgumentErrors, HfArgumentParser):
    """`finetune`'s parser and, as its subparsers' class, each command's (TRL's `make_parser(subparsers)`
    with TrlParser): a command's flags are the fields of its dataclass, their help in the metadata.

    HfArgumentParser makes every field a `--flag` of one value or "+" values; written here by hand
    are the kinds of field it lacks: `positional` ones (metadata), flags whose metadata gives
    argparse's own `action` or `nargs` (`--stop a --stop b`; `--copy NAME DIR`), and switches: a bool
    that defaults to False takes no value, where HfArgumentParser's `--flag [true|false]` would take
    the word after it (`finetune run --doctor recipe.yaml` read the recipe as the switch's value).
    Help is argparse's plain formatter: the help texts name their own defaults.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", argparse.HelpFormatter)
        super().__init__(*args, **kwargs)

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: Field) -> None:
        options = dict(field.metadata)
        default = field.default_factory() if field.default_factory is not MISSING else field.default
        if options.pop("positional", False):
            if default is not MISSING:
                options.update(nargs="*" if isinstance(default, list) else "?", default=default)
            parser.add_argument(field.name, **options)
        elif "action" in options or "nargs" in options:
            parser.add_argument(f"--{field.name}", default=default, **options)
        elif field.type is bool and default is False:
            parser.add_argument(f"--{field.name}", action="store_true", **options)
        else:
            HfArgumentParser._parse_dataclass_field(parser, field)


class PositiveInt(int):
    """An int flag of 1 or more; argparse names the class in its message ("invalid positive int value")."""

    def __new__(cls, text: str) -> int:  # type: ignore[misc]
        value = int(text)
        if value < 1:
            raise ValueError(text)
        return value


class PositiveFloat(float):
    def __new__(cls, text: str) -> float:  # type: ignore[misc]
        value = float(text)
        if not value > 0 or value == float("inf"):
            raise ValueError(text)
        return value


class Fraction(float):
    def __new__(cls, text: str) -> float:  # type: ignore[misc]
        value = float(text)
        if not 0 <= value < 1:
            raise ValueError(text)
        return value


class PicturePath(str):
    """A picture to write: matplotlib picks the format by the suffix, and writes `name.png` for a name
    without one (reported as the name given), so the suffix is asked for; a missing folder would be a
    traceback after the work."""

    SUFFIXES = (".png", ".svg", ".pdf")

    def __new__(cls, text: str) -> Path:  # type: ignore[misc]
        path = Path(text)
        if path.suffix.lower() not in cls.SUFFIXES or not path.parent.is_dir() or path.is_dir():
            raise ValueError(text)
        return path


PositiveInt.__name__ = "positive int"
PositiveFloat.__name__ = "positive number"
Fraction.__name__ = "fraction (0 to below 1)"
PicturePath.__name__ = f"picture file ({', '.join(PicturePath.SUFFIXES)}, in a folder that exists)"


def placement_of(options: argparse.Namespace) -> Placement:
    return flags_into(Placement, options)


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
