"""Which layers `--fp8` multiplies in float8: one rule, read by the run (finetune/fp8.py, which
converts them through torchao) and by the planner (workload.ModelShape, which counts their weights),
so this module imports no torchao."""

from __future__ import annotations

import torch
from transformers.pytorch_utils import Conv1D

FLOAT8_MULTIPLE = 16  # _scaled_mm needs both sides of each weight to be multiples of 16


def output_layer_of(model: torch.nn.Module) -> torch.nn.Module | None:
    return model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None


def float8_convertible(module: torch.nn.Module, output_layer: torch.nn.Module | None) -> bool:
    """A plain linear or GPT-2 Conv1D layer, not the output layer (its logits feed the loss), with
    sides _scaled_mm takes."""
    if module is output_layer or type(module) not in (torch.nn.Linear, Conv1D):
        return False
    return all(side % FLOAT8_MULTIPLE == 0 for side in module.weight.shape)


def float8_layer_names(model: torch.nn.Module) -> list[str]:
    output_layer = output_layer_of(model)
    return [name for name, module in model.named_modules() if float8_convertible(module, output_layer)]


def float8_weight_count(model: torch.nn.Module) -> int:
    """Values in the weights of the layers --fp8 converts (biases stay in the run's precision)."""
    return sum(model.get_submodule(name).weight.numel() for name in float8_layer_names(model))
