"""The model as it will train: built from its config and weights, grown to the tokenizer, ZeRO-3's
blocks made leaf modules and compiled where the compile plan says, given the tokenizer's pad token,
then changed by the converters. The compile plan is made here because it needs those leaf blocks;
everything else about the run's model comes from models.py and converters.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from finetune.arguments import FinetuneTrainingArguments
from finetune.converters import convert
from finetune.instruction import end_of_turn_ids
from finetune.launched import CompilePlan, Launch
from finetune.models import (
    build_model,
    compile_zero3_blocks,
    gather_zero3_by_block,
    resize_to_tokenizer,
    zero3_linear_warning,
)
from finetune.run_flags import ModelArguments

logger = logging.get_logger("finetune")


def prepare_model(
    model_args: ModelArguments,
    training_args: FinetuneTrainingArguments,
    launch: Launch,
    config: Any,
    location: str,
    tokenizer: PreTrainedTokenizerBase,
    new_tokens: int,
    dtype: str,
    note: Callable[[dict[str, Any]], None],
) -> tuple[Any, CompilePlan]:
    """The model and its compile plan; `note` receives each summary field as soon as it is known (the
    run's record), so that a run failing part-way still says what was done to its model."""
    is_main = training_args.process_index == 0
    model = build_model(model_args, config, location)
    rows = resize_to_tokenizer(model, tokenizer) if new_tokens else None
    if rows and is_main:
        logger.warning(
            f"finetune: the tokenizer adds {new_tokens} tokens: embeddings resized to {rows} rows, the new "
            "ones drawn around the mean of the others"
        )
    note({"embeddings_resized_to": rows})
    leaf_blocks = gather_zero3_by_block(model, bool(model_args.peft), launch.strategy.deepcompile)
    compile_plan = CompilePlan.for_run(launch, training_args, leaf_blocks)
    if training_args.torch_compile and not compile_plan.compiled and is_main:
        logger.warning(
            "finetune: ZeRO-3 runs eager: without leaf blocks its per-module hooks break the graph"
        )
    compiled_blocks = 0
    if compile_plan.scope == "zero3_blocks":
        compiled_blocks = compile_zero3_blocks(model, leaf_blocks, compile_plan.mode)
        warning = zero3_linear_warning(model, leaf_blocks)
        if warning and is_main:
            logger.warning(warning)
    note({"zero3_leaf_modules": leaf_blocks or None, "zero3_compiled_blocks": compiled_blocks or None})
    use_the_tokenizers_pad_token(model, tokenizer)
    model, converted = convert(model, model_args, training_args, launch, dtype)
    note(converted)
    return model, compile_plan


def use_the_tokenizers_pad_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Give the model the pad token load_tokenizer chose (GPT-2 has none: its EOS) before the Trainer
    does the same with a warning on every rank; and, where a chat template ends a turn with its own
    token (ChatML's <|im_end|>), that token as an end of generation in the saved generation_config.json,
    as TRL's setup_chat_format does: `generate`, pipelines and inference servers read it there."""
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        stops = end_of_turn_ids(tokenizer)
        if len(stops) > 1:
            model.generation_config.eos_token_id = stops
