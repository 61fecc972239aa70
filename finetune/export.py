"""Consolidated Hugging Face model folders from any strategy's (possibly sharded) training state.

A checkpoint of a `--peft` run holds only the adapters: its export is peft's adapter folder (for
`PeftModel.from_pretrained` on the base model), or with `merge` the base with the adapters merged
in by peft's `merge_and_unload`, a plain model folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Trainer
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from finetune import safe_unpickling
from finetune.adapters import adapter_config
from finetune.checkpoint import (
    checkpoint_problem,
    load_weights_only,
    read_manifest,
    remove_if_empty,
    swapped_to_nvme,
)
from finetune.disk_space import is_disk_full, report_disk_full
from finetune.errors import FinetuneError, first_line
from finetune.evaluation import TrainedWith
from finetune.models import OWN_LAYERS, load_config, resolve_model
from finetune.outputs import share_from_main
from finetune.run_flags import ModelArguments
from finetune.run_folder import FINAL_MODEL_STAGING, STAGING_DIR

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def save_consolidated_model(
    trainer: Trainer, output_dir: str | Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    """Write config, tokenizer and model.safetensors loadable by plain `from_pretrained`. Collective.

    accelerate's `get_state_dict` gathers ZeRO-3 partitions (16-bit weights) and FSDP2 shards into
    one full state dict; every rank must call it, only the main process writes. It writes into a
    staging folder and moves each file in by a rename: a full disk then leaves no truncated
    tokenizer.json or half a model.safetensors in the run folder, only the one-line error (every rank
    raises it) with the checkpoint to go on from.
    """
    accelerator = trainer.accelerator
    state_dict = accelerator.get_state_dict(trainer.model_wrapped)  # ZeRO-3: None except on rank 0
    problem = None
    if accelerator.is_main_process:
        output = Path(output_dir)
        staged = output / STAGING_DIR / FINAL_MODEL_STAGING
        shutil.rmtree(staged, ignore_errors=True)
        try:
            model = accelerator.unwrap_model(trainer.model)
            model.save_pretrained(
                staged, state_dict=without_compile_prefix(state_dict), safe_serialization=True
            )
            tokenizer.save_pretrained(staged)
        except Exception as error:  # safetensors' SafetensorError, torch's RuntimeError, OSError
            if not is_disk_full(error, output):
                raise
            problem = str(report_disk_full(error, staged, output, "the trained model"))
        else:
            for written in sorted(staged.iterdir()):
                os.replace(written, output / written.name)
            staged.rmdir()
            remove_if_empty(staged.parent)
    problem = share_from_main(problem)
    if problem is not None:
        raise FinetuneError(problem)
    accelerator.wait_for_everyone()


COMPILE_PREFIX = "_orig_mod."


def without_compile_prefix(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Key names as the model has them: a compiled model's state dict (which accelerate returns
    for the compiled DDP and FSDP2 wrappers) prefixes every key with torch.compile's `_orig_mod.`,
    and `from_pretrained` would find none of the weights under those names."""
    return {name.replace(COMPILE_PREFIX, ""): tensor for name, tensor in state_dict.items()}


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def checkpoint_kind(checkpoint: Path) -> str:
    """deepspeed (ZeRO partitions), fsdp (sharded distributed checkpoint) or hf (a model.safetensors)."""
    if (checkpoint / "latest").is_file() or any(checkpoint.glob("global_step*")):
        return "deepspeed"
    if any(checkpoint.glob("pytorch_model_fsdp_*")):
        return "fsdp"
    if any(checkpoint.glob("model*.safetensors")) or (checkpoint / ADAPTER_WEIGHTS).is_file():
        return "hf"
    raise FinetuneError(
        f"{checkpoint} holds no model weights this tool knows (DeepSpeed, FSDP or safetensors)"
    )


def full_state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The whole model's weights from one checkpoint, on CPU, in one process.

    DeepSpeed: the fp32 master weights, merged from the optimizer partitions by DeepSpeed's own
    zero_to_fp32; with the optimizer swapped to NVMe the masters are raw swap files zero_to_fp32 cannot
    read, and the weights are those ZeRO-3 gathered into the checkpoint when saving it (the model's
    own, in its compute dtype). FSDP: accelerate's merge_fsdp_weights of the distributed checkpoint.
    """
    kind = checkpoint_kind(checkpoint)
    if kind == "deepspeed" and swapped_to_nvme(checkpoint):
        if not any(checkpoint.glob("model*.safetensors")):
            raise FinetuneError(
                f"{checkpoint}: its optimizer states are NVMe swap files that zero_to_fp32 cannot read, and "
                'it holds no gathered weights ("stage3_gather_16bit_weights_on_model_save": false)'
            )
        return load_safetensors_folder(checkpoint)
    if kind == "deepspeed":
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return dict(get_fp32_state_dict_from_zero_checkpoint(str(checkpoint)))
    if kind == "fsdp":
        from accelerate.utils import merge_fsdp_weights

        with tempfile.TemporaryDirectory(prefix="finetune-export-") as folder:
            shards = sorted(checkpoint.glob("pytorch_model_fsdp_*"))[0]
            merge_fsdp_weights(str(shards), folder, safe_serialization=True)
            return load_safetensors_folder(Path(folder))
    return load_safetensors_folder(checkpoint)


def load_safetensors_folder(folder: Path) -> dict[str, torch.Tensor]:
    state_dict: dict[str, torch.Tensor] = {}
    for shard in sorted([*folder.glob("model*.safetensors"), *folder.glob(ADAPTER_WEIGHTS)]):
        state_dict.update(load_file(shard))
    return state_dict


def export_checkpoint(
    checkpoint: str | Path,
    output_dir: str | Path,
    dtype: str = "fp32",
    merge: bool = False,
    base_model: str | None = None,
) -> Path:
    """A checkpoint of any profile as a plain Hugging Face model folder (config, tokenizer, safetensors),
    with what its run trained with beside them (`evaluation.TrainedWith.FILE`: `finetune eval` of the
    folder scores the run's block size and held-out share, which a plain model folder does not say).

    Only a checkpoint whose files match its manifest is read, and never with code it brings along:
    no custom config, model or tokenizer code, pickles restricted (finetune.checkpoint.load_weights_only).
    A `--peft` run's checkpoint gives its adapter folder, or with `merge` the merged model, on the base
    model its manifest names or on `base_model` (the base moved, or lives elsewhere on this machine).
    """
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    if not checkpoint.exists():
        raise FinetuneError(f"{checkpoint}: no such checkpoint folder")
    if not (checkpoint / "config.json").is_file():
        raise FinetuneError(f"{checkpoint} is not a checkpoint folder (no config.json)")
    problem = checkpoint_problem(checkpoint)
    if problem:
        raise FinetuneError(f"{checkpoint}: {problem}")
    safe_unpickling.check_metadata_files(checkpoint)
    load_weights_only()
    flags = (read_manifest(checkpoint).get("run") or {}).get("flags", {})
    if flags.get("peft"):
        export_adapters(
            checkpoint, output_dir, {**flags, "model": base_model or flags["model"]}, dtype, merge
        )
    else:
        export_whole_model(checkpoint, output_dir, dtype, merge, base_model)
    # `finetune eval` of the folder then scores the length and held-out share the run trained with
    TrainedWith.read(checkpoint).write(output_dir)
    return output_dir


def export_whole_model(
    checkpoint: Path, output_dir: Path, dtype: str, merge: bool, base_model: str | None
) -> None:
    if base_model:
        raise FinetuneError(f"--base_model: {checkpoint} is not from a --peft run, it holds the whole model")
    if merge:
        raise FinetuneError(
            f"{checkpoint} is not from a --peft run: it holds the whole model, there are no adapters to merge"
        )
    try:
        config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise FinetuneError(
            f"{checkpoint}: cannot load its config or tokenizer: {first_line(error)}"
        ) from None
    state_dict = full_state_dict(checkpoint)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    model.tie_weights()
    missing = [name for name in missing if model.get_parameter(name).is_meta]
    if missing or unexpected:
        raise FinetuneError(
            f"{checkpoint}: weights do not match its config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.to(DTYPES[dtype]).save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)


def export_adapters(
    checkpoint: Path, output_dir: Path, flags: dict[str, Any], dtype: str, merge: bool
) -> None:
    """The adapters of a `--peft` checkpoint on the base model its run started from (its manifest's
    flags name both), saved as peft's adapter folder or, with `merge`, merged into a plain model.

    Every profile's checkpoint holds the adapters under other names (peft's adapter file, FSDP's
    adapter-only distributed checkpoint, DeepSpeed's trainable-only fp32 masters): peft's own
    `get_peft_model_state_dict` and `set_peft_model_state_dict` map each onto the rebuilt model.
    """
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    model_args = ModelArguments(model=flags["model"], config_overrides=flags.get("config_overrides"))
    location = resolve_model(model_args.model)
    try:
        config = load_config(model_args, location)
        base = AutoModelForCausalLM.from_pretrained(
            location, config=config, dtype=torch.float32, trust_remote_code=False, **OWN_LAYERS
        )
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise FinetuneError(
            f"{checkpoint}: cannot load its base model {flags['model']} from {location}: {first_line(error)}"
        ) from None
    model = get_peft_model(base, adapter_config(flags, base))
    adapters = get_peft_model_state_dict(
        model, state_dict=without_compile_prefix(full_state_dict(checkpoint))
    )
    expected = get_peft_model_state_dict(model)
    missing = sorted(set(expected) - set(adapters))
    if missing or not adapters:
        raise FinetuneError(
            f"{checkpoint}: its adapters do not match --peft {flags['peft']} with rank {flags['lora_rank']} "
            f"on {flags['model']} (missing {missing[:3]})"
        )
    set_peft_model_state_dict(model, adapters)
    if merge:
        merged = model.merge_and_unload()
        merged.to(DTYPES[dtype]).save_pretrained(output_dir, safe_serialization=True)
    else:
        model.to(DTYPES[dtype]).save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
