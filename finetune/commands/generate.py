"""`finetune generate`: prompts completed by a saved model, plain or as a chat."""

from __future__ import annotations

import argparse

from finetune.commands.shared import flags_into
from finetune.errors import FinetuneError


def add_parser(commands: argparse._SubParsersAction) -> None:
    generation = commands.add_parser("generate", help="complete prompts with a saved model")
    generation.add_argument("model", help="a model folder (a run's output_dir, an export) or a name")
    generation.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for more)")
    generation.add_argument("--prompts_file", help="a file of prompts, one per line")
    generation.add_argument("--max_new_tokens", type=int, default=50)
    generation.add_argument("--temperature", type=float, default=1.0)
    generation.add_argument("--top_k", type=int, default=50)
    generation.add_argument("--top_p", type=float, default=1.0)
    generation.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    generation.add_argument("--seed", type=int, default=42, help="sampling seed (same seed, same text)")
    generation.add_argument(
        "--stop", action="append", default=[], help="text that ends a completion (repeat for more)"
    )
    generation.add_argument(
        "--chat",
        action="store_true",
        help="each prompt is a user's message, rendered by the chat template saved with the model",
    )
    generation.add_argument("--system", help="with --chat: a system message before each prompt")


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
