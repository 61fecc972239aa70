"""`finetune eval`: perplexity of a saved model, answer-only loss and exact match on instruction data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from finetune.commands.shared import EVAL_DATA_FLAGS
from finetune.errors import FinetuneError
from finetune.run_flags import DataArguments, add_run_flags


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="perplexity of a saved model on a dataset split (sliding window); on instruction data the "
        "answer-only loss and, with --generate, exact match of generated answers",
    )
    evaluate.add_argument("model", help="a model folder (a run's output_dir, an export) or a name")
    add_run_flags(evaluate, DataArguments, EVAL_DATA_FLAGS)  # the data read as run.py reads it
    evaluate.add_argument("--split", default="validation", choices=["train", "validation", "test"])
    evaluate.add_argument(
        "--block_size",
        type=int,
        help="window length (default: the block size a run trained at, else the context)",
    )
    evaluate.add_argument("--stride", type=int, help="window step (default: the block size, no overlap)")
    evaluate.add_argument("--batch_size", type=int, default=8, help="windows per forward")
    evaluate.add_argument("--max_tokens", type=int, help="evaluate only the split's first N tokens")
    evaluate.add_argument(
        "--generate",
        action="store_true",
        help="instruction data: complete each prompt greedily and score exact match of the answers",
    )
    evaluate.add_argument(
        "--answer_pattern",
        help="regular expression that finds the answer in completion and reference, its first group if "
        "it has one (GSM8K: '#### (.+)'; default: the whole stripped text)",
    )
    evaluate.add_argument(
        "--max_new_tokens", type=int, help="tokens generated per prompt at most (default 256)"
    )
    evaluate.add_argument(
        "--max_examples", type=int, help="instruction data: evaluate only the split's first N examples"
    )
    evaluate.add_argument("--output", help="also write the result to this JSON file")
    evaluate.add_argument(
        "--completions",
        help="--generate: write every prompt, completion, answer and reference to this JSONL file "
        "(default: beside --output as RESULT.completions.jsonl, else eval-SPLIT.completions.jsonl in the "
        "model's folder)",
    )
    evaluate.add_argument(
        "--stop", action="append", default=[], help="--generate: text that ends an answer (repeat for more)"
    )


def execute(options: argparse.Namespace) -> int:
    from finetune.evaluation import AnswerCheck, evaluate_saved_model
    from finetune.launched import Launch

    if not options.generate and (options.answer_pattern is not None or options.max_new_tokens is not None):
        raise FinetuneError("--answer_pattern and --max_new_tokens score generated answers: add --generate")
    max_new_tokens = 256 if options.max_new_tokens is None else options.max_new_tokens
    if options.stop and not options.generate:
        raise FinetuneError("--stop ends generated answers: add --generate")
    answers = (
        AnswerCheck(options.answer_pattern, max_new_tokens, tuple(options.stop)) if options.generate else None
    )
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
            Path(options.output).write_text(json.dumps(result, indent=2) + "\n")
        if completions is not None:
            write_completions(
                completions,
                options.completions or completions_path(options.output, options.model, options.split),
            )
    return 0


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
