"""What `--fp8` changes in what autograd keeps for backward, counted on CPU.

The planner's compiled activation kinds are fitted to GPU peaks of bf16 matmuls; torchao's float8
training (finetune/fp8.py) changes what a compiled block saves: the partitioner keeps the float8
casts of each matmul's input and weight for the backward (one byte a value) instead of their bf16
values. This counts it: blocks built from a model's config with 1 and 2 layers, at 128 and 256
tokens, each forward walked through its autograd graph (compiled blocks save through
CompiledFunction, which `saved_tensors_hooks` do not see), every saved storage counted once,
parameters left out; solved for the bytes one layer keeps per token and width, and per layer whatever
the tokens (the matmuls' weights cast for the backward), with and without `--fp8`. The partitioner's
choices are made before inductor lowers the graph for a device, so a CPU build sees what a GPU's
does; benchmarks/cpu-2026-12-05-float8/NOTES.md sets the result beside the GPU peaks.

Regimes, as run.py trains them:
- single: fp32 weights under bf16 autocast, each block compiled (single's and ddp's default);
- single_eager: the same with --torch_compile false;
- fsdp: every weight in bf16 (FSDP2's mixed precision gathers them so), no autocast, each block compiled.

usage: FINETUNE_DATA_DIR=... [REGIMES="single fsdp"] bash benchmarks/run.sh float8_census --out DIR [MODEL...]
(REGIMES: some of them; eager float8 is the slow one on CPU, some 12 minutes a row on 2 cores)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from llama_shapes import CENSUS_MODELS, llama_config
from saved_tensor_census import census_grid, layer_terms  # the same two depths at the same two lengths
from transformers import AutoConfig, AutoModelForCausalLM

from finetune.fp8 import convert_to_float8

REGIMES = ("single", "single_eager", "fsdp")
MODELS = ("gpt2-medium", "gpt2-xl", "llama-0.36b", "llama-1b")


def config_for(model: str, layers: int) -> AutoConfig:
    if model in CENSUS_MODELS:
        return llama_config(CENSUS_MODELS[model], num_hidden_layers=layers)
    config = AutoConfig.from_pretrained(Path(os.environ["FINETUNE_DATA_DIR"], model))
    config.num_hidden_layers = layers
    # attention dropout sends SDPA to its math path on CPU; the rest's masks are alike with and without fp8
    config.attn_pdrop = config.resid_pdrop = config.embd_pdrop = 0.0
    return config


def build(model: str, layers: int, regime: str, fp8: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(config_for(model, layers), attn_implementation="sdpa").train()
    if regime == "fsdp":
        built.to(torch.bfloat16)
    if fp8:
        convert_to_float8(built)
    if regime != "single_eager":
        # every build compiles the same block code anew: past dynamo's recompile limit it would run eager
        torch._dynamo.reset()
        for block in built.model.layers if model in CENSUS_MODELS else built.transformer.h:
            block.forward = torch.compile(block.forward)
    return built


def saved_storages(output: torch.Tensor) -> dict[int, int]:
    """Every storage the graph behind `output` saved for backward, by address, with its bytes."""
    storages: dict[int, int] = {}
    seen: set[int] = set()
    pending = [output.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        saved = list(getattr(node, "saved_tensors", ()) or ())
        for name in dir(node):
            if name.startswith("_saved_"):
                value = getattr(node, name)
                saved += list(value) if isinstance(value, tuple) else [value]
        for tensor in saved:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        pending += [following for following, _ in node.next_functions]
    return storages


def saved_bytes(model: torch.nn.Module, tokens: int, autocast: bool) -> int:
    ids = torch.randint(0, 1000, (1, tokens))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        # the layers, not the loss; no KV cache, as run.py trains (its packed batches say use_cache=False)
        hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(size for pointer, size in saved_storages(hidden).items() if pointer not in weights)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())  # tied ones once


def census(model: str, regime: str, fp8: bool) -> dict[str, float]:
    """One layer's saved bytes as fixed + per_token·T, from two depths at two lengths."""
    grid = census_grid(
        lambda layers: build(model, layers, regime, fp8),
        lambda built, tokens: saved_bytes(built, tokens, regime != "fsdp"),
    )
    per_token, fixed = layer_terms(grid)
    return {"layer_per_token": per_token, "layer_fixed": fixed}


def main(out_dir: Path, models: list[str]) -> None:
    regimes = os.environ.get("REGIMES", " ".join(REGIMES)).split()
    if unknown := sorted(set(regimes) - set(REGIMES)):
        sys.exit(f"float8_census.py: unknown REGIMES {' '.join(unknown)} (known: {' '.join(REGIMES)})")
    rows = []
    for model in models:
        hidden = config_for(model, 1).hidden_size
        block_parameters = parameter_count(build(model, 1, "single_eager", False)) - parameter_count(
            build(model, 0, "single_eager", False)
        )
        for regime in regimes:
            for fp8 in (False, True):
                counts = census(model, regime, fp8)
                rows.append(
                    {
                        "model": model,
                        "regime": regime,
                        "fp8": fp8,
                        "layer_bytes_per_token_hidden": round(counts["layer_per_token"] / hidden, 3),
                        "layer_fixed_bytes_per_parameter": round(counts["layer_fixed"] / block_parameters, 3),
                        "block_parameters": block_parameters,
                        **{key: round(value) for key, value in counts.items()},
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "float8_census.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:] or list(MODELS))
