"""A model's shape as the planner counts it, from its config alone (no weights): a run's model by name
or folder, or a size of the ladder `finetune plan --largest` climbs, which needs no config files."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from finetune.adapters import ALL_LINEAR
from finetune.errors import FinetuneError, first_line
from finetune.workload import ModelShape

# GPT-2 sizes as published (layers, width, heads): plans for them need no config files.
GPT2_SIZES = {
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
}
# Larger GPT-style sizes (GPT-3's 1.3B to 13B with head size 128, OPT's 30B and 66B) on GPT-2's
# architecture, vocabulary and context: the ladder `finetune plan --largest` climbs.
LARGER_GPT_SIZES = {
    "gpt-1.3b": (24, 2048, 16),
    "gpt-2.7b": (32, 2560, 32),
    "gpt-6.7b": (32, 4096, 32),
    "gpt-13b": (40, 5120, 40),
    "gpt-30b": (48, 7168, 56),
    "gpt-66b": (64, 9216, 72),
}
MODEL_LADDER = {**GPT2_SIZES, **LARGER_GPT_SIZES}
LADDER_BLOCK_SIZE = 1024  # their context


def local_folder(model: str) -> str | None:
    """The model's folder here (a path or under $FINETUNE_DATA_DIR), or None."""
    from finetune.models import resolve_model

    try:
        location = resolve_model(model)
    except FinetuneError:
        return None
    return location if Path(location).is_dir() else None


def ladder_config(name: str) -> Any:
    """A GPT-2-architecture config of a MODEL_LADDER size."""
    from transformers import GPT2Config

    layers, width, heads = MODEL_LADDER[name]
    return GPT2Config(n_layer=layers, n_embd=width, n_head=heads)


@cache
def gpt2_shape(name: str) -> ModelShape:
    """A GPT-2-architecture shape of MODEL_LADDER, counted on the meta device."""
    return ModelShape.from_config(name, ladder_config(name))


def model_config(model: str, config_overrides: str | None = None) -> Any:
    """The model's config as a run reads it, overrides applied."""
    from finetune.models import apply_config_overrides, load_config, resolve_model
    from finetune.run_flags import ModelArguments

    location = resolve_model(model) if model not in MODEL_LADDER else local_folder(model)
    if location is None:  # a GPT-2 size without its folder here: its shape is built in, no Hub needed
        config = ladder_config(model)
        if config_overrides:
            apply_config_overrides(config, config_overrides)
        return config
    return load_config(ModelArguments(model=model, config_overrides=config_overrides), location)


def shape_of(
    model: str,
    config_overrides: str | None = None,
    block_size: int | None = None,
    sequence_parallel: int = 1,
    adapter_targets: str = ALL_LINEAR,
) -> tuple[ModelShape, int]:
    """The model's shape and the block size a run of it trains at (`block_size`, else its default),
    from its config alone (no weights), its adapter sums over the layers `adapter_targets` names; a
    block longer than the model's context, heads the sequence degree cannot split or an adapter
    target no layer has are refused in one line, as the run refuses them."""
    from finetune.models import choose_block_size
    from finetune.sequence_parallel import check_heads

    config = model_config(model, config_overrides)
    try:  # the model's own constructor checks its shape (heads dividing the width, and so on)
        shape = ModelShape.from_config(model, config, adapter_targets)
    except ValueError as error:
        raise FinetuneError(
            f"{model} with --config_overrides {config_overrides}: {first_line(error)}"
        ) from None
    if sequence_parallel > 1:
        check_heads(config, sequence_parallel)
    return shape, choose_block_size(block_size, config)
