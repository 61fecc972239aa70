"""LoRA and DoRA adapters through peft: the adapter config a run's flags ask for, and what it trains.

Everything here is peft's own (`LoraConfig(use_dora=...)`, `get_peft_model`); this module only turns
the run's flags into that config, records them with each checkpoint (so a resume with another
adapter is refused and `finetune export` can rebuild the adapted model from any profile's
checkpoint) and counts what is trained.

The default targets are peft's "all-linear": every `nn.Linear` and transformers `Conv1D` (GPT-2's
projections) except the output layer, so the same default serves GPT-2 and Llama-style models.
GPT-2's Conv1D stores its weight transposed; `fan_in_fan_out` says so to peft, which would otherwise
set it itself with a warning on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from finetune.errors import FinetuneError

DEFAULT_LORA_DROPOUT = 0.05  # --lora_dropout's default, which the planner assumes too

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PEFT_METHODS = ("lora", "dora")
ALL_LINEAR = "all-linear"
ADAPTER_FLAGS = ("peft", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules")
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# transformers is imported where it is used: the command line (finetune/commands/) reads PEFT_METHODS, and
# importing transformers' model classes would add seconds to every `finetune` command.


def target_modules(value: str) -> str | list[str]:
    """`all-linear`, or a comma-separated list of module names (peft matches their name's end)."""
    if value.strip().lower() == ALL_LINEAR:
        return ALL_LINEAR
    return [name.strip() for name in value.split(",") if name.strip()]


def adapter_config(flags: dict[str, Any], model: torch.nn.Module | None = None) -> Any:
    """peft's LoraConfig for the adapter flags (ADAPTER_FLAGS, as `adapter_flags` records them).

    `model` decides fan_in_fan_out (transposed Conv1D weights); without it, as for GPT-2, when the
    flags alone cannot tell, peft sets it itself.
    """
    from peft import LoraConfig, TaskType
    from transformers.pytorch_utils import Conv1D

    transposed = model is not None and any(isinstance(module, Conv1D) for module in model.modules())
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=flags["lora_rank"],
        lora_alpha=flags["lora_alpha"],
        lora_dropout=flags["lora_dropout"],
        target_modules=target_modules(flags["lora_target_modules"]),
        use_dora=flags["peft"] == "dora",
        fan_in_fan_out=transposed,
    )


def adapter_flags(model_args: Any) -> dict[str, Any]:
    """The adapter flags that define a run, for its identity (finetune/resume.py) and its checkpoints.

    `peft` is always there (None for full fine-tuning), so a resume that adds or drops `--peft`
    is refused; the LoRA settings only when there is an adapter, so full fine-tuning's identity
    holds nothing it does not use.
    """
    if not model_args.peft:
        return {"peft": None}
    return {name: getattr(model_args, name) for name in ADAPTER_FLAGS}


def add_adapters(model: PreTrainedModel, flags: dict[str, Any], compute_dtype: str) -> Any:
    """The model wrapped by peft with fresh adapters, its base frozen and kept in the compute dtype.

    The frozen base needs no fp32 master copy, so under bf16/fp16 it is cast to that dtype (DeepSpeed
    casts it anyway); the adapters stay fp32 (peft's default), as the optimizer's weights must. Under
    ZeRO-3 the base is already partitioned in DeepSpeed's own dtype handling and is left as it is.
    """
    from peft import get_peft_model
    from transformers.integrations import is_deepspeed_zero3_enabled

    dtype = COMPUTE_DTYPES.get(compute_dtype)
    if dtype is not None and not is_deepspeed_zero3_enabled():
        model.to(dtype)
    # for a model of remote code, which had no meta-device check (run.py); its names only, as ZeRO-3 has
    # partitioned the weights that the rank check reads
    check_targets(model, flags["lora_target_modules"])
    return get_peft_model(model, adapter_config(flags, model))


def adapted_layers(model: torch.nn.Module, targets: str) -> list[tuple[str, torch.nn.Module]]:
    """The layers `--lora_target_modules targets` adapts, as peft chooses them: for "all-linear"
    (`_maybe_include_all_linear_layers`) every Linear and Conv1D layer but the output layer; for
    names, the Linear and Conv1D layers whose name is one of them or ends with "." and one of them."""
    wanted = target_modules(targets)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    layers = linear_layers(model)
    if wanted == ALL_LINEAR:
        return [(name, module) for name, module in layers if module is not output]
    return [(name, module) for name, module in layers if _named(name, wanted)]


def _named(name: str, wanted: list[str]) -> bool:
    return any(name == target or name.endswith(f".{target}") for target in wanted)


def check_targets(model: torch.nn.Module, targets: str) -> None:
    """Each name of --lora_target_modules names a linear layer of the model: peft adapts what matches
    and drops a misspelt name without a word, or fails after the model is built when none does.
    Checked on the meta-device model before any data is read."""
    wanted = target_modules(targets)
    if wanted == ALL_LINEAR:
        return
    adapted = [name for name, _ in adapted_layers(model, targets)]
    missing = [target for target in wanted if not any(_named(name, [target]) for name in adapted)]
    if missing:
        raise FinetuneError(
            f"--lora_target_modules {targets}: no linear layer of this model is named {missing[0]}; "
            f"its linear layers: {', '.join(linear_layer_names(model))} (or all-linear)"
        )


def check_adapters(model: torch.nn.Module, targets: str, rank: int) -> None:
    """The adapter flags against the model's layers, on the meta-device model before any data is read."""
    check_targets(model, targets)
    check_rank(rank, narrowest_adapted_width(model, targets))


def linear_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The layers LoRA adapts here: Linear, and transformers' Conv1D (GPT-2's projections)."""
    from transformers.pytorch_utils import Conv1D

    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, (torch.nn.Linear, Conv1D))
    ]


def linear_layer_names(model: torch.nn.Module) -> list[str]:
    """Their distinct last names, as --lora_target_modules takes them."""
    return list(dict.fromkeys(name.rsplit(".", 1)[-1] for name, _ in linear_layers(model)))


def trainable_parameters(model: torch.nn.Module) -> int:
    """Parameters the optimizer updates. Under ZeRO-3 `ds_numel` holds a partitioned one's full size."""
    unique = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    return sum(getattr(p, "ds_numel", p.numel()) for p in unique)


def narrowest_adapted_width(model: torch.nn.Module, targets: str = ALL_LINEAR) -> int:
    """The smallest of min(in, out) over the layers `targets` adapts: the highest rank any of their
    updates can have, whatever the adapter's rank (0 where nothing is adapted)."""
    return min((min(_features(module)) for _, module in adapted_layers(model, targets)), default=0)


def check_rank(rank: int, narrowest: int) -> None:
    """A rank above a layer's narrower side adds parameters an update can never use: B·A of rank r on
    a layer of n inputs or outputs has rank at most n. peft builds it without a word."""
    if narrowest and rank > narrowest:
        raise FinetuneError(
            f"--lora_rank {rank} is above {narrowest}, the narrower side of the narrowest layer it adapts: "
            f"no update of that layer has a higher rank; give --lora_rank {narrowest} or less"
        )


def _features(module: torch.nn.Module) -> tuple[int, int]:
    """(in, out) of a Linear, or of transformers' Conv1D, which stores its weight transposed."""
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, Conv1D):
        features_in, features_out = module.weight.shape
        return features_in, features_out
    return module.in_features, module.out_features


def adapted_layer_sizes(model: torch.nn.Module, targets: str = ALL_LINEAR) -> tuple[int, int]:
    """(sum of in + out features, sum of out features) over the layers `targets` adapts.

    LoRA of rank r adds r·(in + out) parameters per layer, DoRA also one magnitude per output: the
    planner counts adapters from these two sums without building them.
    """
    in_out = outputs = 0
    for _, module in adapted_layers(model, targets):
        features_in, features_out = _features(module)
        in_out += features_in + features_out
        outputs += features_out
    return in_out, outputs
