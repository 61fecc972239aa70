"""`finetune generate`: prompts completed by a saved model, plain or as a chat."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from finetune.commands.shared import flags_into
from finetune.errors import FinetuneError


@dataclass
class GenerateFlags:
    model: str = field(
        metadata={"positional": True, "help": "a model folder (a run's output_dir, an export) or a name"}
    )
    prompt: list[str] = field(
        default_factory=list, metadata={"action": "append", "help": "a prompt (repeat for more)"}
    )
    prompts_file: str | None = field(default=None, metadata={"help": "a file of prompts, one per line"})
    max_new_tokens: int = field(default=50, metadata={"help": "tokens generated per prompt at most"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_k: int = field(default=50, metadata={"help": "sample among the k likeliest tokens"})
    top_p: float = field(default=1.0, metadata={"help": "sample among the likeliest tokens of this mass"})
    greedy: bool = field(default=False, metadata={"help": "greedy decoding instead of sampling"})
    seed: int = field(default=42, metadata={"help": "sampling seed (same seed, same text)"})
    stop: list[str] = field(
        default_factory=list,
        metadata={"action": "append", "help": "text that ends a completion (repeat for more)"},
    )
    chat: bool = field(
        default=False,
        metadata={
            "help": "each prompt is a user's message, rendered by the chat template saved with the model"
        },
    )
    system: str | None = field(
        default=None, metadata={"help": "with --chat: a system message before each prompt"}
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "generate", help="complete prompts with a saved model", dataclass_types=[GenerateFlags]
    )


COMPLETION_MARK = "\u2192"  # "→", printed between a plain prompt and its completion


def execute(options: argparse.Namespace) -> int:
    from finetune.generate import Chat, Sampling, generate, read_prompts

    if options.system is not None and not options.chat:
        raise FinetuneError("--system is the system message of a --chat conversation: add --chat")
    prompts = read_prompts(options.prompt, options.prompts_file)
    sampling = flags_into(Sampling, options, stop=tuple(options.stop))
    chat = Chat(options.system) if options.chat else None
    for prompt, completion in zip(prompts, generate(options.model, prompts, sampling, chat), strict=True):
        # the marker shows where the prompt ends and the model's text begins
        print(
            f"user: {prompt}\nassistant: {completion}" if chat else f"{prompt}{COMPLETION_MARK}{completion}"
        )
    return 0
