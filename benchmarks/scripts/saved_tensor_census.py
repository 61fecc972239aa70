"""What autograd keeps for backward, counted on CPU: the eager part of the planner's activations.

Runs one forward of a model built from its config with 1 and 2 layers, at 128 and 256 tokens, under
a `saved_tensors_hooks` that records every tensor saved for backward (by storage, parameters left
out), and solves for the bytes one layer keeps per token and per layer. Nothing here is fitted: the
numbers are what the forward saves under each regime a profile trains in:

- single: as run.py builds it (full fine-tuning: fp32 weights; --peft: the base in bf16, adapters
  fp32), torch autocast to bf16;
- fsdp: every parameter in bf16, as FSDP2's mixed precision gathers them, under autocast;
- deepspeed: every parameter in bf16, as DeepSpeed's bf16 mode keeps them, without autocast.

Each for full fine-tuning and for LoRA (rank 16, all linear layers) with and without its dropout.

GPT-2's attention dropout is set to 0: on CPU it sends SDPA to its math path, which keeps the
T-by-T scores that the GPU kernels do not. The whole forward at the calibration workload (micro batch
8, block 1024, the model's own loss as run.py computes it by default) is printed beside the GPU's own
"first forward" allocation where a stored log has one.

usage: FINETUNE_DATA_DIR=... python benchmarks/scripts/saved_tensor_census.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from llama_shapes import CENSUS_MODELS, llama_config
from transformers import AutoConfig, AutoModelForCausalLM

from finetune.adapters import add_adapters

GIB = 2**30
TOKENS = (128, 256)
WORKLOAD_TOKENS = 8 * 1024
REGIMES = ("single", "fsdp", "deepspeed")
LORA = {"peft": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_target_modules": "all-linear"}
ADAPTERS = (None, 0.05, 0.0)  # full fine-tuning, then LoRA at run.py's default dropout and without


def config_for(model: str, layers: int) -> AutoConfig:
    if model in CENSUS_MODELS:
        return llama_config(CENSUS_MODELS[model], num_hidden_layers=layers)
    config = AutoConfig.from_pretrained(Path(os.environ["FINETUNE_DATA_DIR"], model))
    config.num_hidden_layers = layers
    config.attn_pdrop = 0.0
    return config


def build(model: str, layers: int, lora_dropout: float | None, regime: str) -> torch.nn.Module:
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(config_for(model, layers), attn_implementation="sdpa")
    if lora_dropout is not None:
        built = add_adapters(built, {**LORA, "lora_dropout": lora_dropout}, "bf16")
    if regime != "single":
        built.to(torch.bfloat16)
    return built.train()


def saved_bytes(model: torch.nn.Module, tokens: int, autocast: bool) -> int:
    storages: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, 1000, (1, tokens))
    with (
        torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
    ):
        model(input_ids=ids, labels=ids)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(size for pointer, size in storages.items() if pointer not in weights)


def census_grid(
    build_layers: Callable[[int], torch.nn.Module], count: Callable[[torch.nn.Module, int], int]
) -> dict[tuple[int, int], int]:
    """`count` (saved bytes of a model at a length) at 1 and 2 layers x the TOKENS lengths, each depth
    built once by `build_layers`."""
    return {
        (layers, tokens): count(built, tokens)
        for layers in (1, 2)
        for built in [build_layers(layers)]
        for tokens in TOKENS
    }


def layer_terms(grid: dict[tuple[int, int], int]) -> tuple[float, float]:
    """One layer's saved bytes per token and whatever the tokens, from a grid of (layers, tokens) at 1
    and 2 layers and the two TOKENS lengths: the second layer's difference, solved as a + b·T."""
    low, high = TOKENS
    per_token = ((grid[2, high] - grid[1, high]) - (grid[2, low] - grid[1, low])) / (high - low)
    return per_token, grid[2, low] - grid[1, low] - per_token * low


def census(model: str, lora_dropout: float | None, regime: str) -> dict[str, float]:
    """Saved bytes as a + b·T for the layers and for the rest (embeddings, final norm, loss)."""
    low, high = TOKENS
    grid = census_grid(
        lambda layers: build(model, layers, lora_dropout, regime),
        lambda built, tokens: saved_bytes(built, tokens, regime != "deepspeed"),
    )
    layer_per_token, layer_fixed = layer_terms(grid)
    rest_per_token = (grid[1, high] - grid[1, low]) / (high - low) - layer_per_token
    rest_fixed = grid[1, low] - layer_fixed - (layer_per_token + rest_per_token) * low
    return {
        "layer_per_token": layer_per_token,
        "layer_fixed": layer_fixed,
        "rest_per_token": rest_per_token,
        "rest_fixed": rest_fixed,
    }


def forward_gib(counts: dict[str, float], layers: int, tokens: int) -> float:
    per_layer = counts["layer_fixed"] + counts["layer_per_token"] * tokens
    return (layers * per_layer + counts["rest_fixed"] + counts["rest_per_token"] * tokens) / GIB


def main(out_dir: Path) -> None:
    rows = []
    for model, layers, hidden in (("gpt2-medium", 24, 1024), ("llama-0.36b", 24, 1024)):
        for lora_dropout in ADAPTERS:
            for regime in REGIMES:
                counts = census(model, lora_dropout, regime)
                rows.append(
                    {
                        "model": model,
                        "peft": None if lora_dropout is None else "lora",
                        "lora_dropout": lora_dropout,
                        "regime": regime,
                        "layer_bytes_per_token_hidden": round(counts["layer_per_token"] / hidden, 1),
                        "forward_gib_b8_t1024": round(forward_gib(counts, layers, WORKLOAD_TOKENS), 2),
                        **{key: round(value) for key, value in counts.items()},
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "census.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
