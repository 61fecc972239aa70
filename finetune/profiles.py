"""Strategy profiles: the accelerate YAML files in accelerate_configs/ and the DeepSpeed JSON they name.

Profiles are plain files users read and copy; this module only finds, describes and checks them,
so a broken profile fails before launch with the file and key at fault (the DeepSpeed JSON's own
checks are finetune/deepspeed_json.py's).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from finetune.config_files import parse_yaml
from finetune.deepspeed_json import (
    GRADIENT_BYTES,
    OFFLOAD_KEYS,
    check_deepspeed_config,
    needs_nvme_path,
    read_deepspeed_config,
)
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
DEEPSPEED_REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's default reduce_bucket_size, in values
DEEPSPEED_SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's default sub_group_size, in values
DEEPSPEED_STAGE3_HELD_VALUES = 1_000_000_000  # its default stage3_max_reuse_distance and _live_parameters


STATES = ("optimizer", "gradients", "parameters")  # in the order ZeRO's stages shard them
STATE_NAMES = {"optimizer": "optimizer states", "gradients": "gradients", "parameters": "parameters"}
OFFLOAD_DEVICES = ("cpu", "nvme")
FRAMEWORKS = ("single", "ddp", "deepspeed", "fsdp")  # ties in the speed order go in this order,
FULL_SHARDING_TIES = ("single", "ddp", "fsdp", "deepspeed")  # but these where every state is sharded


# torch.compile modes that record CUDA graphs
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
FSDP_VERSION = 2  # the FSDP the profiles train with: FSDP2 (fully_shard), whatever launches them


@dataclass(frozen=True)
class Strategy:
    """What a profile does, derived once from its YAML and DeepSpeed JSON (or FSDP settings).

    Every command asks this, never the profile's name: the planner's memory model, `--profile auto`,
    `finetune compare`, the compile default at run time, the CLI's help and the README's table. So a
    copied and edited profile means what its files say, wherever a shipped name works.
    """

    name: str
    framework: str  # single, ddp, deepspeed or fsdp
    sharded: frozenset[str] = frozenset()  # of STATES, divided over the processes
    optimizer_offload: str = "none"  # none, cpu or nvme
    parameter_offload: str = "none"
    zero_stage: int | None = None
    reshard_after_forward: bool | None = None
    needs_nvme_path: bool = False
    description: str = ""  # the profile's own words: its YAML's first comment line
    # the DeepSpeed JSON's "compile": {"deepcompile": true}: DeepSpeed compiles the whole model and
    # schedules ZeRO-3's gathers in the graph instead of in per-module hooks
    deepcompile: bool = False
    # DeepSpeed's gradient reduce buffers (`reduce_buffers`): how many and their size in values, None
    # where the JSON says "auto" (transformers then fills hidden_size squared)
    reduce_buffers: int = 0
    reduce_bucket_values: int | None = None
    # bytes of a gradient value as DeepSpeed reduces them under sequence parallelism: its engine switches
    # the communication dtype to seq_parallel_communication_data_type (fp32 unless the JSON says otherwise)
    sequence_parallel_gradient_bytes: int = 4
    # ZeRO-3's sub_group_size: its optimizer steps the fp32 partition in groups of at most this many
    # values, each with a gradient copy of its own (memory_model.optimizer_step_gib); None elsewhere
    optimizer_sub_group_values: int | None = None
    # ZeRO-3's gathered weights a forward leaves whole for the backward: at most
    # stage3_max_reuse_distance (and stage3_max_live_parameters) values
    # (memory_model.gathered_parameter_gib); None elsewhere
    gathered_parameter_values: int | None = None
    # torch.compile through accelerate compiles each transformer block on its own (its loss beside)
    # rather than the whole model: the YAML's dynamo_use_regional_compilation (`compiles_by_blocks`)
    compiles_by_blocks: bool = False
    # torch.compile's mode for accelerate's compile: the YAML's dynamo_mode (reduce-overhead records
    # CUDA graphs, as the single profile asks)
    compile_mode: str = "default"
    # ZeRO-3's zero.Init swaps torch.nn.functional.linear for DeepSpeed's own unless the JSON says
    # "memory_efficient_linear": false (the shipped stage-3 JSONs do): compiled blocks of nn.Linear
    # layers then recompile on each weight and run eager, and adapters keep more (memory_model)
    deepspeed_linear: bool = False
    # ZeRO-3 with "reduce_scatter": false and contiguous_gradients (on by default): under Ulysses,
    # DeepSpeed before 0.20.2 leaves the gradients of some buckets scaled by the group size
    # (finetune.sequence_parallel.check_strategy refuses to split sequences under it)
    reduces_split_gradients_unevenly: bool = False

    @property
    def records_cuda_graphs(self) -> bool:
        """The profile's compile mode records CUDA graphs (kept where `keeps_cuda_graphs` says)."""
        return self.compile_mode in CUDA_GRAPH_MODES

    @property
    def compiles_in_place(self) -> bool:
        """FSDP2 and DeepSpeed compile the model they wrap, which evaluation then runs as trained;
        accelerate compiles a copy of it under single and DDP, and evaluation picks one of the two
        (FinetuneTrainer._wrap_model)."""
        return self.framework in ("fsdp", "deepspeed")

    @property
    def multi_process(self) -> bool:
        return self.framework != "single"

    @property
    def is_zero3(self) -> bool:
        """DeepSpeed's stage 3: parameters partitioned and gathered module by module in its hooks
        (zero_stage is None outside DeepSpeed)."""
        return self.zero_stage == 3

    @property
    def gathers_weights_only_in_forward(self) -> bool:
        """ZeRO-3: a sharded weight is whole only inside its own module's forward, and its gradient is
        reduced from there, so a loss that reads the output weight outside it cannot train (the
        chunked loss: finetune/losses.py; the planner counts the model's own loss there)."""
        return self.is_zero3

    @property
    def sequence_split(self) -> str | None:
        """How `--sequence_parallel` splits each sample's tokens under this profile: "ulysses"
        (DeepSpeed's Ulysses: attention heads over the group, ZeRO-3 partitioning the model), "ring"
        (torch's context parallel through accelerate: keys and values passed round the group, FSDP2
        sharding the model over it), or None where the profile keeps every sample on one process."""
        if self.is_zero3:
            return "ulysses"
        if self.framework == "fsdp":
            return "ring"
        return None

    @property
    def splits_sequences(self) -> bool:
        return self.sequence_split is not None

    @property
    def runs_float8(self) -> bool:
        """--fp8 runs under torch's own training (single, ddp, FSDP2), not under DeepSpeed's engine,
        which is not tested with torchao's float8 layers."""
        return self.framework != "deepspeed"

    @property
    def kept_sharded(self) -> frozenset[str]:
        """The states each process keeps only its shard of between uses, which is what its memory
        holds of them: `sharded` (the ZeRO stage a profile is the analogue of, which orders speed and
        names the plan's sharding) but for FSDP2, whose fp32 parameters stay sharded under both
        profiles; without resharding after forward it holds gathered compute-dtype copies beside them
        from forward to backward instead (memory_model.fsdp_unsharded_gib)."""
        return frozenset(STATES) if self.framework == "fsdp" else self.sharded

    @property
    def offloaded(self) -> dict[str, str]:
        """State (optimizer, parameters) to the device it is moved to (cpu, nvme)."""
        moved = {"optimizer": self.optimizer_offload, "parameters": self.parameter_offload}
        return {state: device for state, device in moved.items() if device != "none"}

    @property
    def compiled_by_default(self) -> bool:
        """Compile where it was measured to pay off: every profile without offload.

        Compiling fuses the elementwise work between matmuls, which made one GPU and ZeRO-2 markedly
        faster. Block by block (accelerate's regional compilation, `compiles_by_blocks`) was faster
        than the whole model for ddp and ZeRO-1/2 and held less; FSDP2 compiled as one graph breaks at
        its hooks and was slower than eager. ZeRO-3 was slower compiled through accelerate (its hooks
        break the graph), and faster, with less memory, with only its leaf blocks' forwards compiled
        (`launched.CompilePlan`).
        Offload was not timed compiled. The measurements: docs/speed.md. A machine
        without a GPU never compiles by default (`launch_settings.compiles_by_default`).
        """
        return not self.offloaded

    @property
    def speed_order(self) -> tuple[int, int, int, int]:
        """Sort key, fastest first, where a step's host work shows (a small model's micro batch; the
        planner's `speed_rank` puts FSDP first where the micro batch hides it): each step keeps less
        per GPU and moves more. Offload to NVMe is slower than to CPU, offloading more is slower,
        sharding more communicates more. At equal sharding ZeRO-2 ran ahead of FSDP2's grad-op sharding
        (gpt2-medium at micro batch 8), and FSDP2's full sharding ran ahead of ZeRO-3, whose hooks run
        per module, on every model, micro batch and GPU count measured (docs/speed.md)."""
        worst_offload = max((OFFLOAD_DEVICES.index(d) + 1 for d in self.offloaded.values()), default=0)
        ties = FULL_SHARDING_TIES if len(self.sharded) == len(STATES) else FRAMEWORKS
        return worst_offload, len(self.offloaded), len(self.sharded), ties.index(self.framework)

    @property
    def kind(self) -> str:
        """The strategy in a few words."""
        if self.framework == "single":
            return "one device, no distribution"
        if self.framework == "ddp":
            return "DistributedDataParallel"
        if self.framework == "fsdp":
            if self.reshard_after_forward:
                return "FSDP2 full shard (ZeRO-3 analogue)"
            return "FSDP2 without resharding after forward (ZeRO-2 analogue)"
        if "nvme" in self.offloaded.values():
            return f"DeepSpeed ZeRO-Infinity, stage {self.zero_stage}"
        if self.offloaded:
            return f"DeepSpeed ZeRO-Offload, stage {self.zero_stage}"
        return f"DeepSpeed ZeRO-{self.zero_stage}"

    @property
    def sharding(self) -> str:
        if not self.multi_process:
            return ""
        text = ", ".join(STATE_NAMES[state] for state in STATES if state in self.sharded) or "nothing"
        if self.framework == "fsdp" and not self.reshard_after_forward:
            text += " (parameters gathered from forward to backward)"
        return text

    @property
    def offloading(self) -> str:
        places = {"cpu": "CPU memory", "nvme": "NVMe"}
        if self.needs_nvme_path:
            places["nvme"] = "an NVMe folder (`--nvme_path DIR`)"
        return "; ".join(
            " and ".join(STATE_NAMES[state] for state in STATES if self.offloaded.get(state) == device)
            + f" to {places[device]}"
            for device in OFFLOAD_DEVICES
            if device in self.offloaded.values()
        )

    @property
    def summary(self) -> str:
        """One line: the strategy, what it shards and moves, and whether it compiles by default."""
        parts = [self.kind]
        if self.sharded:
            parts.append(f"shards {self.sharding}")
        if self.offloaded:
            parts.append(f"moves {self.offloading}")
        parts.append("compiled by default" if self.compiled_by_default else "eager by default")
        return "; ".join(parts)


def keeps_cuda_graphs(gradient_checkpointing: bool, accumulation: int, flex_attention: bool = False) -> bool:
    """Whether a run keeps a profile's CUDA-graph mode: checkpointing, accumulated micro batches and
    flex attention run torch's default mode instead (launched.BatchGeometry.apply says why)."""
    return not (gradient_checkpointing or accumulation > 1 or flex_attention)


def compiles_by_blocks(distributed_type: str, dynamo_config: dict[str, Any] | None) -> bool:
    """Whether a profile's `dynamo_config` asks accelerate for block by block (regional) compilation.

    accelerate's multi-GPU and FSDP launchers pass the section on, and leave the whole model where it
    is silent. Its DeepSpeed launcher drops it (`finetune run` passes it on), so a plain launch of a
    DeepSpeed profile cannot say: there blocks unless told otherwise, as every shipped DeepSpeed
    profile that compiles asks (their whole-model graph ran slower and held more).
    """
    asked = (dynamo_config or {}).get("dynamo_use_regional_compilation")
    if asked is None:
        return distributed_type == "DEEPSPEED"
    return str(asked).lower() == "true"


def derive_strategy(
    name: str,
    distributed_type: str,
    fsdp_config: dict[str, Any] | None = None,
    deepspeed_config: dict[str, Any] | None = None,
    description: str = "",
    dynamo_config: dict[str, Any] | None = None,
) -> Strategy:
    """The one place where accelerate's and DeepSpeed's settings become a Strategy."""
    by_blocks = compiles_by_blocks(distributed_type, dynamo_config)
    mode = str((dynamo_config or {}).get("dynamo_mode") or "default")
    if distributed_type == "FSDP":
        fsdp = fsdp_config or {}
        reshard = bool(fsdp.get("fsdp_reshard_after_forward", True))
        offload = "cpu" if fsdp.get("fsdp_offload_params") else "none"  # FSDP2 moves all states then
        sharded = STATES if reshard else STATES[:2]
        return Strategy(name, "fsdp", frozenset(sharded), offload, offload, None, reshard, False, description,
                        compiles_by_blocks=by_blocks, compile_mode=mode)  # fmt: skip
    if distributed_type == "DEEPSPEED":
        config = deepspeed_config or {}
        zero = config.get("zero_optimization", {})
        stage = int(zero.get("stage", 0))
        optimizer, parameters = (zero.get(key, {}).get("device", "none") for key in OFFLOAD_KEYS)
        nvme = needs_nvme_path(config)
        sharded = frozenset(STATES[:stage])
        deepcompile = bool((config.get("compile") or {}).get("deepcompile", False))
        buffers, bucket = reduce_buffers(zero, stage)
        sequence_parallel_dtype = config.get("seq_parallel_communication_data_type", "fp32")
        sub_group = int(float(zero.get("sub_group_size", DEEPSPEED_SUB_GROUP_SIZE))) if stage == 3 else None
        gathered = gathered_parameter_values(zero) if stage == 3 else None
        # DeepSpeed's own defaults are on
        deepspeed_linear = stage == 3 and bool(zero.get("memory_efficient_linear", True))
        contiguous = zero.get("contiguous_gradients", True)
        uneven = stage == 3 and contiguous and not zero.get("reduce_scatter", True)
        return Strategy(
            name, "deepspeed", sharded, optimizer, parameters, stage, None, nvme, description, deepcompile,
            reduce_buffers=buffers, reduce_bucket_values=bucket,
            sequence_parallel_gradient_bytes=GRADIENT_BYTES[str(sequence_parallel_dtype).lower()],
            optimizer_sub_group_values=sub_group, gathered_parameter_values=gathered,
            compiles_by_blocks=by_blocks, compile_mode=mode, deepspeed_linear=deepspeed_linear,
            reduces_split_gradients_unevenly=bool(uneven),
        )  # fmt: skip
    framework = "ddp" if distributed_type == "MULTI_GPU" else "single"
    return Strategy(name, framework, description=description, compiles_by_blocks=by_blocks, compile_mode=mode)


def reduce_buffers(zero: dict[str, Any], stage: int) -> tuple[int, int | None]:
    """DeepSpeed's gradient reduce buffers of reduce_bucket_size values, with contiguous_gradients (its
    default), as it allocates them: ZeRO-1/2 (stage_1_and_2.py) one, a second with overlap_comm, at a
    backward's first gradient; ZeRO-3 (stage3.py) one per communication dtype, when the optimizer is
    set up, so it is held from before the first step."""
    if stage not in (1, 2, 3) or not zero.get("contiguous_gradients", True):
        return 0, None
    count = 2 if stage in (1, 2) and zero.get("overlap_comm", False) else 1
    size = zero.get("reduce_bucket_size", DEEPSPEED_REDUCE_BUCKET_SIZE)
    return count, None if size == "auto" else int(float(size))


def gathered_parameter_values(zero: dict[str, Any]) -> int:
    """The most values of gathered weights ZeRO-3 keeps from a forward for the backward: its reuse
    distance, capped by its live-parameter limit (DeepSpeed's defaults where the JSON is silent)."""
    return min(
        int(float(zero.get(key, DEEPSPEED_STAGE3_HELD_VALUES)))
        for key in ("stage3_max_reuse_distance", "stage3_max_live_parameters")
    )


def fastest_first(strategies: list[Strategy]) -> list[Strategy]:
    return sorted(strategies, key=lambda strategy: strategy.speed_order)


def shipped_strategies() -> list[Strategy]:
    """Every shipped profile's strategy, fastest first."""
    return fastest_first([load_profile(path).strategy for path in available_profiles()])


def load_strategy(name_or_path: str | Path) -> Strategy:
    return load_profile(name_or_path).strategy


def conventional_name(strategy: Strategy) -> str:
    """The name the shipped profiles give such a strategy."""
    if strategy.framework == "fsdp":
        return "fsdp" if strategy.reshard_after_forward else "fsdp_grad_op"
    if strategy.framework != "deepspeed":
        return strategy.framework
    devices = set(strategy.offloaded.values())
    suffix = "_nvme" if "nvme" in devices else "_offload" if devices else ""
    return f"zero{strategy.zero_stage}{suffix}"


PROFILES_TABLE_MARKERS = (
    "<!-- profiles table: python -m finetune.profiles -->",
    "<!-- end profiles table -->",
)


def profiles_table(strategies: list[Strategy]) -> str:
    """The README's table of profiles, fastest first, generated so that it cannot drift from them."""
    lines = [
        "| profile | strategy | sharded over the GPUs | moved off the GPU "
        "| compiled by default on GPUs (CPU runs eager) |",
        "|---|---|---|---|---|",
    ]
    for s in strategies:
        compiled = "yes" if s.compiled_by_default else "no"
        lines.append(f"| `{s.name}` | {s.kind} | {s.sharding} | {s.offloading} | {compiled} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    distributed_type: str
    settings: dict[str, Any]
    strategy: Strategy
    deepspeed_config_path: Path | None = None
    deepspeed_config: dict[str, Any] | None = None

    @property
    def multi_process(self) -> bool:
        return self.strategy.multi_process


def available_profiles(directory: Path = PROFILES_DIR) -> list[Path]:
    return sorted(directory.glob("*.yaml"))


def profile_path(name_or_path: str) -> Path:
    """A profile by name (`zero3`) or by path (`my_configs/zero3_tuned.yaml`)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FinetuneError(f"profile file {path} does not exist")
        return path
    if path.suffix or len(path.parts) > 1:
        hint = (
            ": a DeepSpeed JSON is named by a profile's deepspeed_config.deepspeed_config_file "
            "(`finetune profiles --copy zero3 DIR` writes such a pair)"
            if path.suffix == ".json"
            else ""
        )
        raise FinetuneError(
            f"profile {path}: a profile is a name or an accelerate config file (.yaml, .yml){hint}"
        )
    candidate = PROFILES_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        names = ", ".join(p.stem for p in available_profiles())
        raise FinetuneError(f"unknown profile '{name_or_path}' (available: {names})")
    return candidate


def load_profile(name_or_path: str | Path) -> Profile:
    """Parse and validate one profile; every problem is one FinetuneError naming the file and key."""
    path = profile_path(str(name_or_path))
    text = path.read_text()
    settings = parse_yaml(text, path)
    if not isinstance(settings, dict):
        raise FinetuneError(f"{path}: a profile is a YAML mapping of accelerate config keys")
    distributed_type = str(settings.get("distributed_type", ""))
    if distributed_type not in DISTRIBUTED_TYPES:
        raise FinetuneError(
            f"{path}: distributed_type: '{distributed_type}' is not one of {', '.join(DISTRIBUTED_TYPES)}"
        )
    description = _description(text)
    ds_path, ds_config = None, None
    if distributed_type == "FSDP":
        _check_fsdp(path, settings)
    if distributed_type == "DEEPSPEED":
        ds_path = _deepspeed_config_path(path, settings)
        ds_config = read_deepspeed_config(ds_path)
        check_deepspeed_config(ds_path, ds_config)
    strategy = derive_strategy(
        path.stem, distributed_type, settings.get("fsdp_config"), ds_config, description,
        settings.get("dynamo_config"),
    )  # fmt: skip
    return Profile(path.stem, path, description, distributed_type, settings, strategy, ds_path, ds_config)


def copy_profile(name_or_path: str, folder: Path) -> list[Path]:
    """Write an editable copy of a profile into `folder`: its YAML and, for DeepSpeed, its JSON.

    The copied YAML names the copied JSON by its path from the working directory, as the shipped
    profiles name theirs, so `accelerate launch --config_file` finds it when run from here (and
    `finetune run --profile` from anywhere: `resolve_project_path`). Existing files are never replaced.
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


def _check_fsdp(path: Path, settings: dict[str, Any]) -> None:
    fsdp = settings.get("fsdp_config")
    if not isinstance(fsdp, dict):
        raise FinetuneError(f"{path}: fsdp_config: missing (an FSDP profile needs its fsdp_config mapping)")
    if fsdp.get("fsdp_version") != FSDP_VERSION:
        raise FinetuneError(
            f"{path}: fsdp_config.fsdp_version: must be {FSDP_VERSION} (this project uses FSDP2)"
        )
    if not isinstance(fsdp.get("fsdp_reshard_after_forward"), bool):
        raise FinetuneError(f"{path}: fsdp_config.fsdp_reshard_after_forward: must be true or false")


def _deepspeed_config_path(path: Path, settings: dict[str, Any]) -> Path:
    ds_settings = settings.get("deepspeed_config")
    if not isinstance(ds_settings, dict) or not ds_settings.get("deepspeed_config_file"):
        raise FinetuneError(f"{path}: deepspeed_config.deepspeed_config_file: missing")
    return resolve_project_path(ds_settings["deepspeed_config_file"], path)


def resolve_project_path(value: str, profile_file: Path) -> Path:
    """A JSON path in a profile: from the working directory first, as `accelerate launch` reads it.

    For a copied profile, then from its own folder and the one above it, where a copy keeps its JSON (a
    copied `accelerate_configs/` beside its `ds_configs/`, or `finetune profiles --copy`'s folder, run
    from anywhere); last from the shipped files (a shipped profile, or a YAML copied alone that names a
    shipped JSON). A working-directory file that differs from the one beside a copied profile is
    refused: which of the two the user edited cannot be told, and training with the other would be
    silent. A shipped profile takes a working-directory JSON as `accelerate launch` would.
    """
    named = f"{profile_file}: deepspeed_config.deepspeed_config_file: {value}"
    candidate = Path(value)
    if candidate.is_absolute():
        if not candidate.is_file():
            raise FinetuneError(f"{named} does not exist")
        return candidate.resolve()
    from_cwd = (Path.cwd() / candidate).resolve()
    folder = profile_file.resolve().parent
    copies = () if folder == PROFILES_DIR.resolve() else (folder / candidate, folder.parent / candidate)
    beside = next((p.resolve() for p in copies if p.is_file()), None)
    if from_cwd.is_file():
        if beside not in (None, from_cwd) and beside.read_bytes() != from_cwd.read_bytes():
            raise FinetuneError(
                f"{named} is both {from_cwd} (from the working directory) and {beside} (beside the "
                "profile), and they differ: write the one you mean as an absolute path"
            )
        return from_cwd
    shipped = shipped_folder("ds_configs").parent / candidate
    found = beside or (shipped.resolve() if shipped.is_file() else None)
    if found is None:
        raise FinetuneError(
            f"{named} does not exist (looked from the working directory, beside the profile, in the shipped "
            "files)"
        )
    return found


if __name__ == "__main__":
    print(profiles_table(shipped_strategies()))
