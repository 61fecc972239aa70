"""A model's forward replaced (finetune/forwards.py) as the chunked loss and the training forward
without logits replace it: the libraries around the model must still see the model's own."""

from __future__ import annotations

import inspect

import torch
from accelerate.utils import compile_regions
from transformers import AutoModelForCausalLM

from finetune.forwards import replace_forward
from finetune.losses import use_chunked_loss


def passed_through(self, own, *args, **kwargs):
    return own(self, *args, **kwargs)


def runs_the_compiled_blocks(model) -> bool:
    """Whether a forward (without labels) of regional compilation's copy of `model` runs the copy's
    compiled blocks."""
    copy = compile_regions(model, backend="eager")
    calls = []
    copy.transformer.h[0].register_forward_hook(lambda *args: calls.append(1))
    copy(input_ids=torch.randint(0, 1000, (2, 16)))
    return calls == [1]


def test_a_replaced_forward_keeps_the_models_signature(tiny_gpt2_dir):
    """The Trainer passes only the dataset columns the forward's signature names."""
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir)
    own = inspect.signature(model.forward)
    replace_forward(model, passed_through)
    assert inspect.signature(model.forward) == own


def test_a_replaced_forward_runs_the_blocks_regional_compilation_compiled(tiny_gpt2_dir):
    """accelerate's regional compilation copies the model around its compiled blocks and rebinds its
    forward to the copy: the forward must run the copy's blocks, not the original's."""
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir)
    replace_forward(model, passed_through)
    assert runs_the_compiled_blocks(model)


def test_a_packed_batchs_position_ids_reach_a_model_under_the_chunked_loss(tiny_gpt2_dir):
    """Packed instruction data parts its examples by position ids; a forward whose signature did not
    name them had the Trainer drop them, and the examples attended to each other."""
    model = use_chunked_loss(AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir))
    assert "position_ids" in inspect.signature(model.forward).parameters


def test_generation_under_the_chunked_loss_runs_the_compiled_blocks(tiny_gpt2_dir):
    assert runs_the_compiled_blocks(use_chunked_loss(AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir)))
