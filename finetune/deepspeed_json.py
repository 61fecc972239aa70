"""The DeepSpeed JSON a profile names: read and checked as DeepSpeed and accelerate will read it (one
line naming the file and key, before launch and on every rank), and its NVMe placeholder filled from
--nvme_path. The file stays the user's: the filled copy is written into the --nvme_path folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.config_files import parse_json
from finetune.errors import FinetuneError, first_line

NVME_PLACEHOLDER = "auto"
OFFLOAD_KEYS = ("offload_optimizer", "offload_param")
GRADIENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}  # DeepSpeed's communication_data_type names


def read_deepspeed_config(path: Path) -> dict[str, Any]:
    config = parse_json(path.read_text(), path)
    if not isinstance(config, dict):
        raise FinetuneError(f"{path}: a DeepSpeed config is a JSON object")
    return config


def check_deepspeed_config(path: Path, config: dict[str, Any]) -> None:
    """A DeepSpeed JSON a profile names, checked as DeepSpeed and accelerate will read it: one line
    naming the file and key for anything they would refuse later, on every rank."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        raise FinetuneError(f"{path}: zero_optimization: missing")
    stage = zero.get("stage")
    if stage not in (0, 1, 2, 3):
        raise FinetuneError(f"{path}: zero_optimization.stage: must be 0, 1, 2 or 3, got {stage!r}")
    if "offload_param" in zero and stage != 3:
        raise FinetuneError(
            f"{path}: zero_optimization.offload_param: parameter offload needs stage 3, got {stage}"
        )
    for key in OFFLOAD_KEYS:
        offload = zero.get(key)
        if offload is None:
            continue
        if not isinstance(offload, dict):
            raise FinetuneError(f"{path}: zero_optimization.{key}: must be a mapping with a device")
        device = offload.get("device")
        if device not in ("cpu", "nvme", "none"):
            raise FinetuneError(
                f"{path}: zero_optimization.{key}.device: must be cpu, nvme or none, got {device!r}"
            )
        if device == "nvme" and not offload.get("nvme_path"):
            raise FinetuneError(
                f"{path}: zero_optimization.{key}.nvme_path: NVMe offload needs a folder "
                f'(a path, or "{NVME_PLACEHOLDER}" to take --nvme_path)'
            )
        if device != "none" and stage not in (1, 2, 3):
            raise FinetuneError(f"{path}: zero_optimization.{key}: offload needs ZeRO stage 1-3, got {stage}")
    for key in ("communication_data_type", "seq_parallel_communication_data_type"):
        if key in config and str(config[key]).lower() not in GRADIENT_BYTES:
            dtypes = ", ".join(GRADIENT_BYTES)
            raise FinetuneError(f"{path}: {key}: must be one of {dtypes}, got {config[key]!r}")
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if key in config and config[key] != "auto":
            raise FinetuneError(
                f'{path}: {key}: use "auto" so the training flags set it, got {config[key]!r}'
            )
    _check_with_deepspeeds_model(path, zero)


GATHER_ON_SAVE = "stage3_gather_16bit_weights_on_model_save"


def check_final_model_gathered(path: Path, config: dict[str, Any]) -> None:
    """A run ends by writing its model folder, which under ZeRO-3 is accelerate's `get_state_dict`
    gathering the 16-bit weights: it refuses unless the JSON says so, and DeepSpeed's default is
    false. Refused before the data rather than after the training (the checkpoints would hold the
    weights, for `finetune export`, but the run would end failed)."""
    zero = config.get("zero_optimization", {})
    if zero.get("stage") == 3 and zero.get(GATHER_ON_SAVE) is not True:
        raise FinetuneError(
            f"{path}: zero_optimization.{GATHER_ON_SAVE}: must be true under ZeRO-3 (DeepSpeed's default is "
            "false): the run ends by gathering the weights into its model folder"
        )


def _without_auto(section: dict[str, Any]) -> dict[str, Any]:
    """The section less its "auto" values, which accelerate fills in before DeepSpeed reads them."""
    return {
        key: _without_auto(value) if isinstance(value, dict) else value
        for key, value in section.items()
        if value != "auto"
    }


def _check_with_deepspeeds_model(path: Path, zero: dict[str, Any]) -> None:
    """zero_optimization read by DeepSpeed's own config model, as every rank reads it at start: a
    misspelt or mistyped key is this one line here, not a pydantic traceback on every rank later."""
    try:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    except ImportError:  # not installed: launching a DeepSpeed profile fails on that, in its own words
        return
    try:
        DeepSpeedZeroConfig(**_without_auto(zero))
    except ValueError as error:  # pydantic's ValidationError is one
        details = error.errors()[0] if hasattr(error, "errors") else {"loc": (), "msg": first_line(error)}
        where = ".".join(str(part) for part in ("zero_optimization", *details["loc"]))
        raise FinetuneError(f"{path}: {where}: {details['msg']} (DeepSpeed's own check)") from None


def _nvme_sections(config: dict[str, Any]) -> list[dict[str, Any]]:
    zero = config.get("zero_optimization", {})
    sections = (zero.get(key) for key in OFFLOAD_KEYS)
    return [section for section in sections if isinstance(section, dict) and section.get("device") == "nvme"]


def needs_nvme_path(config: dict[str, Any]) -> bool:
    return any(section.get("nvme_path") == NVME_PLACEHOLDER for section in _nvme_sections(config))


def check_nvme_path(config_path: Path | None, config: dict[str, Any] | None, nvme_path: str | None) -> None:
    """--nvme_path exactly where the DeepSpeed JSON swaps to NVMe: refused otherwise in one line, by
    `finetune run` before it launches and by every rank of a bare `accelerate launch`."""
    if config is None or not needs_nvme_path(config):
        if nvme_path:
            raise FinetuneError("--nvme_path is only used with an NVMe-offload profile such as zero3_nvme")
        return
    if not nvme_path:
        raise FinetuneError(
            f"{config_path} offloads to NVMe: pass --nvme_path DIR (a folder on a fast local disk)"
        )


TORCH_ADAMW = ("adamw_torch", "adamw_torch_fused")  # the Trainer's AdamW: the algorithm DeepSpeed's runs


def check_optimizer_flags(
    config_path: Path | None, config: dict[str, Any] | None, optim: str, optim_args: str | None
) -> None:
    """A JSON with an "optimizer" section builds DeepSpeed's own optimizer, and the Trainer then never
    reads --optim or --optim_args (transformers' deepspeed_optim_sched): refused rather than ignored."""
    if config is None or "optimizer" not in config:
        return
    if optim not in TORCH_ADAMW or optim_args:
        section = config["optimizer"]
        kind = section.get("type") if isinstance(section, dict) else None
        flag = f"--optim {optim}" if optim not in TORCH_ADAMW else "--optim_args"
        raise FinetuneError(
            f"{flag}: {config_path} sets DeepSpeed's own optimizer{f' ({kind})' if kind else ''}, which "
            "the Trainer's optimizer flags do not replace: leave them out, or copy the JSON without its "
            '"optimizer" section'
        )


def check_values_match_the_flags(path: Path, config: dict[str, Any], training_args: Any) -> None:
    """Values the JSON sets itself (not "auto") that the training flags set differently (gradient_clipping
    0.5 beside --max_grad_norm's 1.0, a train_batch_size, an fp16 section enabled on a bf16 run): found
    by transformers' own matching, which refuses them only once the data and model are built, a
    traceback on every rank. Asked of a copy once the devices are set up (the world size is known)."""
    from transformers.integrations import deepspeed as hf_deepspeed

    # building one replaces transformers' global ZeRO-3 config reference, which model init reads
    held = hf_deepspeed._hf_deepspeed_config_weak_ref
    try:
        trial = hf_deepspeed.HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
        trial.trainer_config_process(training_args)
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = held
    if trial.mismatches:
        listed = "; ".join(mismatch.removeprefix("- ") for mismatch in trial.mismatches)
        raise FinetuneError(
            f'{path}: set otherwise by the training flags: {listed}: make them "auto" (the flags then set '
            "them) or pass the flags that match"
        )


@dataclass(frozen=True)
class JsonDecidedFlags:
    """The run flags a profile's DeepSpeed JSON has the last word on: --nvme_path (where it swaps to
    NVMe) and --optim/--optim_args (its "optimizer" section). Checked by `finetune run` and `finetune
    compare` before they launch a profile, and by every rank of a bare launch."""

    nvme_path: str | None = None
    optim: str = TORCH_ADAMW[0]
    optim_args: str | None = None

    @classmethod
    def of(cls, training_args: Any) -> JsonDecidedFlags:
        return cls(training_args.nvme_path, training_args.optim, training_args.optim_args)

    def check(self, config_path: Path | None, config: dict[str, Any] | None) -> None:
        check_nvme_path(config_path, config, self.nvme_path)
        check_optimizer_flags(config_path, config, self.optim, self.optim_args)


NO_JSON_DECIDED_FLAGS = JsonDecidedFlags()  # the run flags' defaults: every profile takes them


def fill_nvme_path(config: dict[str, Any], nvme_path: str) -> dict[str, Any]:
    filled = json.loads(json.dumps(config))
    for section in _nvme_sections(filled):
        if section.get("nvme_path") == NVME_PLACEHOLDER:
            section["nvme_path"] = str(Path(nvme_path).resolve())
    return filled


FILLED_CONFIG_NAME = "finetune_deepspeed_config.json"


def write_filled_config(config: dict[str, Any], nvme_path: str) -> Path:
    """The profile's JSON with --nvme_path filled in, written into that folder (which exists).

    Every rank of a machine writes the same file: each writes its own temporary copy and renames it,
    so a rank never reads another's half-written file.
    """
    target = Path(nvme_path).resolve() / FILLED_CONFIG_NAME
    staged = target.with_name(f".{FILLED_CONFIG_NAME}.{os.getpid()}")
    staged.write_text(json.dumps(fill_nvme_path(config, nvme_path), indent=2) + "\n")
    os.replace(staged, target)
    return target


def active_deepspeed_config() -> tuple[Path | None, dict[str, Any] | None]:
    """The DeepSpeed JSON that `accelerate launch` handed this process, if any."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() not in ("1", "true"):
        return None, None
    value = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if not value or value == "none":
        return None, None
    path = Path(value)
    if not path.is_file():
        raise FinetuneError(f"DeepSpeed config {value} (from the launch profile) does not exist")
    return path, read_deepspeed_config(path)
