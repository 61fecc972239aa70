"""`--fp8`: the model's linear layers multiply in float8 through torchao's float8 training.

torchao (`torchao.float8`) casts each matmul's input, weight and output gradient to float8 with a
scale per tensor, multiplies with `torch._scaled_mm` and keeps the weights, optimizer states and
everything else in the run's precision. Only `torch.nn.Linear` is torchao's to convert; GPT-2 keeps
its projections in transformers' `Conv1D` (weight stored in x out), so `Float8Conv1D` below runs
those through the same torchao matmul with the weight left in Conv1D's layout: checkpoints and saved
models are the model's own, loadable without torchao. That class is the one piece written here.
Imported only for a run with --fp8 (arguments.py checks that torchao is there first).

Not converted (finetune/float8_layers.py, the rule the planner counts by too): the output layer (its
logits feed the loss; torchtitan's float8 recipe leaves it out too), layers whose sides are not
multiples of 16 (`_scaled_mm` refuses them), and adapters.
Whether float8 pays is measured, not assumed: docs/speed.md.
"""

from __future__ import annotations

from typing import Any

import torch
from torchao.float8 import Float8LinearConfig, convert_to_float8_training
from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args
from transformers.pytorch_utils import Conv1D

from finetune.errors import FinetuneError
from finetune.float8_layers import float8_convertible, float8_layer_names, output_layer_of

FLOAT8_COMPUTE_CAPABILITY = (8, 9)  # Ada and Hopper onwards multiply in float8


class Float8Conv1D(Float8Linear):
    """GPT-2's Conv1D through torchao's float8 matmul. The weight keeps Conv1D's in x out layout,
    which is the transposed weight torchao's matmul takes: no copy, and no new checkpoint keys."""

    @classmethod
    def from_conv1d(cls, conv: Conv1D, config: Any) -> Float8Conv1D:
        in_features, out_features = conv.weight.shape
        with torch.device("meta"):
            layer = cls(in_features, out_features, bias=False, config=config)
        layer.weight = conv.weight
        layer.bias = conv.bias
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        device_type = input.device.type
        if torch.is_autocast_enabled(device_type):
            input = input.to(torch.get_autocast_dtype(device_type))
        output = matmul_with_hp_or_float8_args.apply(input, self.weight, self.linear_mm_config, self.config)
        return output + self.bias.to(output.dtype) if self.bias is not None else output


def check_float8_gpu() -> None:
    """One clear line on a GPU that cannot multiply in float8 (a CPU can, slowly: the tests run there)."""
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < FLOAT8_COMPUTE_CAPABILITY:
        major, minor = torch.cuda.get_device_capability()
        raise FinetuneError(
            "--fp8 needs a GPU that multiplies in float8 (compute capability 8.9 or newer: L4, RTX 4090, "
            f"H100); {torch.cuda.get_device_name()} is {major}.{minor}"
        )


def convert_to_float8(model: torch.nn.Module) -> int:
    """Swap the model's convertible layers for float8 ones, in place; how many were swapped."""
    check_float8_gpu()
    output_layer = output_layer_of(model)
    config = Float8LinearConfig()
    chosen = float8_layer_names(model)
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        if type(getattr(parent, child)) is Conv1D:
            setattr(parent, child, Float8Conv1D.from_conv1d(getattr(parent, child), config))
    convert_to_float8_training(
        model, config=config, module_filter_fn=lambda module, _name: float8_convertible(module, output_layer)
    )
    return len(chosen)
