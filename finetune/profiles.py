"""Strategy profiles: the accelerate YAML files in accelerate_configs/ and the DeepSpeed JSON they name.

Profiles are plain files users read and copy; this module only finds, describes and checks them,
so a broken profile fails before launch with the file and key at fault.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from accelerate import Accelerator
from accelerate.utils import DynamoBackend

from finetune.errors import FinetuneError


def shipped_folder(name: str) -> Path:
    """One of the folders shipped with the package: accelerate_configs, ds_configs or recipes.

    A wheel carries them inside the package (setup.cfg maps the top-level folders there). An editable
    install or a checkout on sys.path imports the package from the checkout, where they stay
    top-level, beside it: setuptools' editable finder does not import folders without __init__.py.
    """
    installed = Path(str(resources.files("finetune"))) / name
    return installed if installed.is_dir() else Path(__file__).resolve().parent.parent / name


PROFILES_DIR = shipped_folder("accelerate_configs")
RECIPES_DIR = shipped_folder("recipes")


def with_shipped_recipe(run_args: list[str]) -> list[str]:
    """Run flags whose leading recipe (`recipes/NAME.yaml` or `NAME.yaml`), when no such file is here,
    is the shipped recipe of that name: a recipe's launch line then works outside a checkout too."""
    if not run_args or not run_args[0].endswith((".yaml", ".yml")) or Path(run_args[0]).is_file():
        return run_args
    shipped = RECIPES_DIR / Path(run_args[0]).name
    if not shipped.is_file():
        return run_args
    print(f"finetune: {run_args[0]} is not a file here: using the shipped recipe {shipped}", file=sys.stderr)
    return [str(shipped), *run_args[1:]]


DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED")
NVME_PLACEHOLDER = "auto"


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    distributed_type: str
    settings: dict[str, Any]
    deepspeed_config_path: Path | None = None
    deepspeed_config: dict[str, Any] | None = None

    @property
    def needs_nvme_path(self) -> bool:
        return self.deepspeed_config is not None and needs_nvme_path(self.deepspeed_config)

    @property
    def multi_process(self) -> bool:
        return self.distributed_type != "NO"


def available_profiles(directory: Path = PROFILES_DIR) -> list[Path]:
    return sorted(directory.glob("*.yaml"))


def profile_path(name_or_path: str) -> Path:
    """A profile by name (`zero3`) or by path (`my_configs/zero3_tuned.yaml`)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FinetuneError(f"profile file {path} does not exist")
        return path
    candidate = PROFILES_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        names = ", ".join(p.stem for p in available_profiles())
        raise FinetuneError(f"unknown profile '{name_or_path}' (available: {names})")
    return candidate


def load_profile(name_or_path: str | Path) -> Profile:
    """Parse and validate one profile; every problem is one FinetuneError naming the file and key."""
    path = profile_path(str(name_or_path))
    text = path.read_text()
    try:
        settings = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise FinetuneError(f"{path}: not valid YAML ({_first_line(error)})") from None
    if not isinstance(settings, dict):
        raise FinetuneError(f"{path}: a profile is a YAML mapping of accelerate config keys")
    distributed_type = str(settings.get("distributed_type", ""))
    if distributed_type not in DISTRIBUTED_TYPES:
        raise FinetuneError(
            f"{path}: distributed_type: '{distributed_type}' is not one of {', '.join(DISTRIBUTED_TYPES)}"
        )
    profile = Profile(
        name=path.stem,
        path=path,
        description=_description(text),
        distributed_type=distributed_type,
        settings=settings,
    )
    if distributed_type == "FSDP":
        _check_fsdp(path, settings)
    if distributed_type == "DEEPSPEED":
        ds_path = _deepspeed_config_path(path, settings)
        ds_config = read_deepspeed_config(ds_path)
        _check_deepspeed(ds_path, ds_config)
        profile = replace(profile, deepspeed_config_path=ds_path, deepspeed_config=ds_config)
    return profile


def copy_profile(name_or_path: str, folder: Path) -> list[Path]:
    """Write an editable copy of a profile into `folder`: its YAML and, for DeepSpeed, its JSON.

    The copied YAML names the copied JSON by its path from the working directory, as the shipped
    profiles name theirs, so `finetune run --profile` and `accelerate launch --config_file` both
    find it when run from here. Existing files are never replaced.
    """
    profile = load_profile(name_or_path)
    yaml_copy = folder / profile.path.name
    copies = {yaml_copy: profile.path.read_text()}
    if profile.deepspeed_config_path is not None:
        json_copy = folder / profile.deepspeed_config_path.name
        copies[json_copy] = profile.deepspeed_config_path.read_text()
        copies[yaml_copy] = re.sub(
            r"^(\s*deepspeed_config_file:\s*)\S.*?(\s*#.*)?$",
            lambda line: f"{line.group(1)}{json.dumps(str(json_copy))}{line.group(2) or ''}",
            copies[yaml_copy],
            count=1,
            flags=re.MULTILINE,
        )
    copies[yaml_copy] = (
        copies[yaml_copy]
        .replace(f"accelerate_configs/{profile.path.name}", str(yaml_copy))
        .replace(f"--profile {profile.name} ", f"--profile {yaml_copy} ")
    )
    existing = [str(path) for path in copies if path.exists()]
    if existing:
        raise FinetuneError(f"{', '.join(existing)} already exist: copy into another folder, or remove them")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in copies.items():
            path.write_text(text)
    except OSError as error:
        raise FinetuneError(f"cannot write the copy into {folder}: {error.strerror}") from None
    return list(copies)


def _description(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]


def _check_fsdp(path: Path, settings: dict[str, Any]) -> None:
    fsdp = settings.get("fsdp_config")
    if not isinstance(fsdp, dict):
        raise FinetuneError(f"{path}: fsdp_config: missing (an FSDP profile needs its fsdp_config mapping)")
    if fsdp.get("fsdp_version") != 2:
        raise FinetuneError(f"{path}: fsdp_config.fsdp_version: must be 2 (this project uses FSDP2)")
    if not isinstance(fsdp.get("fsdp_reshard_after_forward"), bool):
        raise FinetuneError(f"{path}: fsdp_config.fsdp_reshard_after_forward: must be true or false")


def _deepspeed_config_path(path: Path, settings: dict[str, Any]) -> Path:
    ds_settings = settings.get("deepspeed_config")
    if not isinstance(ds_settings, dict) or not ds_settings.get("deepspeed_config_file"):
        raise FinetuneError(f"{path}: deepspeed_config.deepspeed_config_file: missing")
    return resolve_project_path(ds_settings["deepspeed_config_file"], path)


def resolve_project_path(value: str, profile_file: Path) -> Path:
    """A JSON path in a profile, relative to where users launch from (as `accelerate launch` reads it).

    The working directory comes first, so a user's own ds_configs/ wins; then the shipped files
    (`ds_configs/zero3.json` of an installed package), then the profile's own folder.
    """
    candidate = Path(value)
    if candidate.is_absolute():
        found = candidate
    else:
        shipped_root = shipped_folder("ds_configs").parent
        found = next(
            (
                p
                for p in (Path.cwd() / candidate, shipped_root / candidate, profile_file.parent / candidate)
                if p.is_file()
            ),
            candidate,
        )
    if not found.is_file():
        raise FinetuneError(f"{profile_file}: deepspeed_config.deepspeed_config_file: {value} does not exist")
    return found.resolve()


def read_deepspeed_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise FinetuneError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise FinetuneError(f"{path}: a DeepSpeed config is a JSON object")
    return config


def _check_deepspeed(path: Path, config: dict[str, Any]) -> None:
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
    for key in ("offload_optimizer", "offload_param"):
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
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if key in config and config[key] != "auto":
            raise FinetuneError(
                f'{path}: {key}: use "auto" so the training flags set it, got {config[key]!r}'
            )


def _nvme_sections(config: dict[str, Any]) -> list[dict[str, Any]]:
    zero = config.get("zero_optimization", {})
    sections = (zero.get(key) for key in ("offload_optimizer", "offload_param"))
    return [section for section in sections if isinstance(section, dict) and section.get("device") == "nvme"]


def needs_nvme_path(config: dict[str, Any]) -> bool:
    return any(section.get("nvme_path") == NVME_PLACEHOLDER for section in _nvme_sections(config))


def fill_nvme_path(config: dict[str, Any], nvme_path: str) -> dict[str, Any]:
    filled = json.loads(json.dumps(config))
    for section in _nvme_sections(filled):
        if section.get("nvme_path") == NVME_PLACEHOLDER:
            section["nvme_path"] = str(Path(nvme_path).resolve())
    return filled


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


def strategy_of(accelerator: Accelerator) -> dict[str, Any]:
    """Run-summary fields for the strategy accelerate actually set up, named the way the profiles are."""
    fields: dict[str, Any] = {
        "distributed_type": str(accelerator.distributed_type.value),
        "world_size": accelerator.num_processes,
    }
    deepspeed_plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    fsdp_plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if deepspeed_plugin is not None:
        zero = deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
        offload = zero.get("offload_optimizer", {}).get("device", "none")
        fields["zero_stage"] = deepspeed_plugin.zero_stage
        fields["strategy"] = f"zero{deepspeed_plugin.zero_stage}" + (
            "" if offload == "none" else f"+offload_{offload}"
        )
    elif fsdp_plugin is not None:
        fields["strategy"] = f"fsdp{fsdp_plugin.fsdp_version}" + (
            "" if fsdp_plugin.reshard_after_forward else "_grad_op"
        )
    else:
        fields["strategy"] = "ddp" if accelerator.num_processes > 1 else "single"
    dynamo = accelerator.state.dynamo_plugin
    fields["torch_compile_regional"] = dynamo.backend != DynamoBackend.NO and dynamo.use_regional_compilation
    return fields
