"""`finetune eval`: perplexity of a saved model, answer-only loss and exact match on instruction data."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from finetune.commands.shared import EVAL_DATA_FLAGS
from finetune.errors import FinetuneError
from finetune.run_flags import DataArguments, add_run_flags
from finetune.run_folder import MANIFEST, RESULT_PATTERNS


@dataclass
class EvalFlags:
    model: str = field(
        metadata={"positional": True, "help": "a model folder (a run's output_dir, an export) or a name"}
    )
    split: Literal["train", "validation", "test"] = field(
        default="validation", metadata={"help": "the dataset split evaluated"}
    )
    block_size: int | None = field(
        default=None,
        metadata={"help": "window length (default: the block size a run trained at, else the context)"},
    )
    stride: int | None = field(
        default=None, metadata={"help": "window step (default: the block size, no overlap)"}
    )
    batch_size: int = field(default=8, metadata={"help": "windows per forward"})
    max_tokens: int | None = field(
        default=None, metadata={"help": "evaluate only the split's first N tokens"}
    )
    generate: bool = field(
        default=False,
        metadata={
            "help": "instruction data: complete each prompt greedily and score exact match of the answers"
        },
    )
    answer_pattern: str | None = field(
        default=None,
        metadata={
            "help": "regular expression that finds the answer in completion and reference, its first group "
            "if it has one (GSM8K: '#### (.+)'; default: the whole stripped text)"
        },
    )
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "tokens generated per prompt at most (default 256)"}
    )
    max_examples: int | None = field(
        default=None, metadata={"help": "instruction data: evaluate only the split's first N examples"}
    )
    output: str | None = field(default=None, metadata={"help": "also write the result to this JSON file"})
    completions: str | None = field(
        default=None,
        metadata={
            "help": "--generate: write every prompt, completion, answer and reference to this JSONL file "
            "(default: beside --output as RESULT.completions.jsonl, else eval-SPLIT.completions.jsonl in "
            "the model's folder)"
        },
    )
    stop: list[str] = field(
        default_factory=list,
        metadata={"action": "append", "help": "--generate: text that ends an answer (repeat for more)"},
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="perplexity of a saved model on a dataset split (sliding window); on instruction data the "
        "answer-only loss and, with --generate, exact match of generated answers",
        dataclass_types=[EvalFlags],
    )
    add_run_flags(evaluate, DataArguments, EVAL_DATA_FLAGS)  # the data read as run.py reads it


def execute(options: argparse.Namespace) -> int:
    from finetune.evaluation import AnswerCheck, evaluate_saved_model
    from finetune.launched import Launch

    if not options.generate and (options.answer_pattern is not None or options.max_new_tokens is not None):
        raise FinetuneError("--answer_pattern and --max_new_tokens score generated answers: add --generate")
    max_new_tokens = 256 if options.max_new_tokens is None else options.max_new_tokens
    if options.stop and not options.generate:
        raise FinetuneError("--stop ends generated answers: add --generate")
    if options.completions and not options.generate:  # it would not be written, without a word
        raise FinetuneError("--completions holds generated answers: add --generate")
    answers = (
        AnswerCheck(options.answer_pattern, max_new_tokens, tuple(options.stop)) if options.generate else None
    )
    completions_file = None
    if options.generate:
        default = completions_path(options.output, options.model, options.split)
        completions_file = options.completions or default
    if (
        options.output
        and completions_file
        and Path(options.output).resolve() == Path(completions_file).resolve()
    ):
        raise FinetuneError(f"--output and --completions both name {options.output}: give two files")
    for flag, path in (("--output", options.output), ("--completions", completions_file)):
        if path:
            ready_to_write(flag, path, options.model)
    data_args = DataArguments(**{name: getattr(options, name) for name in EVAL_DATA_FLAGS})
    result = evaluate_saved_model(
        options.model,
        data_args,
        options.split,
        options.block_size,
        options.stride,
        options.batch_size,
        options.max_tokens,
        answers,
        options.max_examples,
    )
    completions = result.pop("_completions", None)
    if Launch.from_environment().rank == 0:
        print(json.dumps(result))
        if options.output:
            try:
                Path(options.output).write_text(json.dumps(result, indent=2) + "\n")
            except OSError as error:
                message = f"--output {options.output}: cannot write it ({error.strerror})"
                raise FinetuneError(message) from None
        if completions is not None:
            write_completions(completions, completions_file)
    return 0


def ready_to_write(flag: str, path: str, model: str) -> None:
    """A result file checked before the evaluation, which can take long: a file that cannot be
    written at its end would throw the evaluation away, and one of the evaluated model's own files
    (its weights, config, tokenizer, a run's summary) must not be written over. Its missing folders
    are made."""
    target = Path(path)
    if target.is_dir():
        raise FinetuneError(f"{flag} {path} is a folder: give a file name")
    if target.resolve() in files_of_the_model(model):
        raise FinetuneError(f"{flag} {path} is a file of the evaluated model {model}: give another file name")
    folder = next((parent for parent in target.parents if parent.exists()), None)
    if folder is not None and not folder.is_dir():
        raise FinetuneError(f"{flag} {path}: {folder} is a file, not a folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FinetuneError(f"{flag} {path}: cannot make its folder ({error.strerror})") from None


def files_of_the_model(model: str) -> set[Path]:
    """A model folder's files as a run or an export leaves them (run_folder's names)."""
    folder = Path(model)
    if not folder.is_dir():
        return set()
    found = (path for pattern in (*RESULT_PATTERNS, MANIFEST) for path in folder.glob(pattern))
    return {path.resolve() for path in found if path.is_file()}


def completions_path(output: str | None, model: str, split: str) -> str:
    """Beside --output (RESULT.completions.jsonl), else in the evaluated model's folder, where they
    stay with what they judge (eval-SPLIT.completions.jsonl); a Hub name has none: the current one."""
    if output:
        return str(Path(output).with_suffix(".completions.jsonl"))
    folder = Path(model) if Path(model).is_dir() else Path()
    return str(folder / f"eval-{split}.completions.jsonl")


def write_completions(records: list[dict], path: str) -> None:
    """Every prompt, completion, extracted answer and reference: a wrong answer can be read."""
    try:
        with open(path, "w", encoding="utf-8") as stream:
            stream.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    except OSError as error:
        raise FinetuneError(f"--completions {path}: cannot write it ({error.strerror})") from None
    print(f"finetune: {len(records)} completions written to {path}", file=sys.stderr)
