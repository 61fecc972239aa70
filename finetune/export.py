"""Consolidated Hugging Face model folders from any strategy's (possibly sharded) training state."""

from __future__ import annotations

from pathlib import Path

from transformers import Trainer
from transformers.tokenization_utils_base import PreTrainedTokenizerBase


def save_consolidated_model(
    trainer: Trainer, output_dir: str | Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    """Write config, tokenizer and model.safetensors loadable by plain `from_pretrained`. Collective.

    accelerate's `get_state_dict` gathers ZeRO-3 partitions (16-bit weights) and FSDP2 shards into
    one full state dict; every rank must call it, only the main process writes.
    """
    accelerator = trainer.accelerator
    state_dict = accelerator.get_state_dict(trainer.model_wrapped)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        model.save_pretrained(output_dir, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(output_dir)
    accelerator.wait_for_everyone()
