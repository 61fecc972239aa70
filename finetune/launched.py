"""What was launched, resolved once per process: the strategy, the processes and how they split the
batch, and how the model is compiled.

`Launch.from_environment` reads the launcher's variables once, before anything else asks (as
torchtitan's ParallelDims); `Launch.check_against` holds it to the Accelerator the Trainer sets up, so
that what the run records is what ran. Everything else reads it: the resume identity, the run
summary and name, the planner, doctor. `BatchGeometry.apply` is the only writer of the batch flags;
`CompilePlan.for_run` the only place that decides what is compiled, beside `check_cuda_graphs`, which
refuses CUDA graphs where the strategy cannot keep them.

How the processes divide the work (data and sequence parallel degrees) is the launch's
`layout` (finetune/layout.py); a new parallel dimension is one field there and one planner term.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import DynamoBackend

from finetune.deepspeed_json import OFFLOAD_KEYS, active_deepspeed_config
from finetune.errors import FinetuneError
from finetune.layout import ParallelLayout
from finetune.profiles import (
    CUDA_GRAPH_MODES,
    FSDP_VERSION,
    Strategy,
    conventional_name,
    derive_strategy,
    keeps_cuda_graphs,
)

PROFILE_VARIABLE = "FINETUNE_PROFILE"  # set by `finetune run` and `compare` for the processes they launch


def launched_with(kind: str) -> bool:
    return os.environ.get(f"ACCELERATE_USE_{kind}", "false").lower() in ("1", "true")


def strategy_from_environment(world_size: int, deepspeed_config: dict[str, Any] | None) -> Strategy:
    """The strategy `accelerate launch` handed this process, from the variables it sets and the
    DeepSpeed JSON they name (as Launch read it): the training process never sees the profile file.
    Named `$FINETUNE_PROFILE` (set by `finetune run` and `compare`), else after the shipped profile it
    matches (`zero3`, `fsdp_grad_op`, ...). Without DeepSpeed or FSDP, `world_size` (as Launch read
    it) tells DDP from a single process."""
    dynamo = {  # the profile's dynamo_config, as accelerate launch passes it on
        key: os.environ[variable]
        for key, variable in (
            ("dynamo_use_regional_compilation", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"),
            ("dynamo_mode", "ACCELERATE_DYNAMO_MODE"),
        )
        if variable in os.environ
    }
    if launched_with("DEEPSPEED"):
        config = deepspeed_config
        if config is None:  # DeepSpeed set up by launch flags instead of a JSON
            zero = {"stage": int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))}
            for key in OFFLOAD_KEYS:
                zero[key] = {"device": os.environ.get(f"ACCELERATE_DEEPSPEED_{key.upper()}_DEVICE", "none")}
            config = {"zero_optimization": zero}
        strategy = derive_strategy("", "DEEPSPEED", deepspeed_config=config, dynamo_config=dynamo)
    elif launched_with("FSDP"):
        version = os.environ.get("FSDP_VERSION", "1")  # accelerate's default where a config names none
        if version != str(FSDP_VERSION):
            raise FinetuneError(
                f"the launch asks for FSDP version {version}: this project trains with FSDP2 "
                f"(fsdp_config.fsdp_version: {FSDP_VERSION}, as in accelerate_configs/fsdp.yaml)"
            )
        fsdp = {
            "fsdp_reshard_after_forward": os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower()
            == "true",
            "fsdp_offload_params": os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true",
        }
        strategy = derive_strategy("", "FSDP", fsdp_config=fsdp, dynamo_config=dynamo)
    else:
        strategy = derive_strategy("", "MULTI_GPU" if world_size > 1 else "NO", dynamo_config=dynamo)
    return replace(strategy, name=os.environ.get(PROFILE_VARIABLE) or conventional_name(strategy))


def strategy_of(accelerator: Any) -> Strategy:
    """The strategy accelerate actually set up, in the same terms, for `Launch.check_against`."""
    deepspeed_plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    fsdp_plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if deepspeed_plugin is not None:
        return derive_strategy("", "DEEPSPEED", deepspeed_config=deepspeed_plugin.deepspeed_config)
    if fsdp_plugin is not None:
        offload = fsdp_plugin.cpu_offload  # FSDP2: an offload policy object, CPUOffloadPolicy when on
        fsdp = {
            "fsdp_reshard_after_forward": bool(fsdp_plugin.reshard_after_forward),
            "fsdp_offload_params": type(offload).__name__ == "CPUOffloadPolicy"
            or bool(getattr(offload, "offload_params", False)),
        }
        return derive_strategy("", "FSDP", fsdp_config=fsdp)
    return derive_strategy("", "MULTI_GPU" if accelerator.num_processes > 1 else "NO")


def placement(strategy: Strategy) -> tuple:
    """Where a strategy keeps each state, what two launches of one strategy share (not its name, nor
    whether its NVMe folder is still to be filled in)."""
    return (strategy.framework, strategy.sharded, strategy.optimizer_offload, strategy.parameter_offload,
            strategy.zero_stage, strategy.reshard_after_forward)  # fmt: skip


def mixed_precision(training_args: Any) -> str:
    """bf16, fp16 or fp32: what resolved flags train in, named as the planner, the checkpoint's run
    identity and the resolved run name it (one rule; the summary's `dtype` adds tf32 matmuls)."""
    return "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"


def visible_gpu_supports_bf16() -> bool | None:
    """Whether the GPU this process sees computes in bf16; None without a GPU. The one probe behind
    `--precision auto`, for the run, `--profile auto` and `finetune plan` alike."""
    return torch.cuda.is_bf16_supported() if torch.cuda.is_available() else None


def precision_on(training_args: Any, gpu_supports_bf16: bool | None) -> str:
    """What these flags train in on a GPU that supports bf16 (True) or not (False), or without a GPU
    (None): `--precision auto` as the launch resolves it (`launch_settings.resolve_launch_settings`) and
    as `--profile auto` plans it before any launch, by this one rule."""
    given = mixed_precision(training_args)
    if (
        given != "fp32"
        or training_args.precision != "auto"
        or training_args.use_cpu
        or gpu_supports_bf16 is None
    ):
        return given
    return "bf16" if gpu_supports_bf16 else "fp16"


@dataclass(frozen=True)
class BatchGeometry:
    """How one optimizer step's samples are made: micro batch x accumulation x data-parallel ranks."""

    micro: int
    accumulation: int
    data_parallel: int

    @property
    def global_batch(self) -> int:
        return self.micro * self.accumulation * self.data_parallel

    def describe(self) -> str:
        processes = f"{self.data_parallel} process{'es' if self.data_parallel != 1 else ''}"
        return (
            f"global batch {self.global_batch} = micro batch {self.micro} x accumulation "
            f"{self.accumulation} x {processes}"
        )

    def check_fits(self, train_samples: int) -> None:
        """A training set smaller than one step's batch makes every step an epoch of fewer samples than
        asked (the Trainer steps at the epoch's end) while the summary and the schedule count the batch
        asked for: refused, once the set's size is known."""
        if train_samples < self.global_batch:
            raise FinetuneError(
                f"the {self.describe()} is larger than the training set ({train_samples} samples): "
                "lower --batch_size or --gradient_accumulation_steps, or give more data"
            )

    @classmethod
    def of(cls, training_args: Any, data_parallel: int) -> BatchGeometry:
        return cls(training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps,
                   data_parallel)  # fmt: skip

    @staticmethod
    def share_per_process(global_batch: int, data_parallel: int) -> int:
        """Each data-parallel process's equal share of the global batch; refused where there is none."""
        per_process, rest = divmod(global_batch, data_parallel)
        if rest:
            s = "es" if data_parallel != 1 else ""
            raise FinetuneError(
                f"--global_batch_size {global_batch} is not a multiple of the {data_parallel} process{s}: "
                "each process takes an equal share"
            )
        return per_process

    @classmethod
    def from_global(
        cls,
        global_batch: int,
        data_parallel: int,
        micro: int | None = None,
        accumulation: int | None = None,
        largest: tuple[int, str] | None = None,
    ) -> tuple[BatchGeometry, str]:
        """The micro batch and accumulation that make `global_batch` exactly, and why.

        A micro batch or accumulation the user gave is kept. Otherwise the micro batch is the largest
        that divides each process's share and is at most `largest` (a micro batch and why it is the
        limit): a larger micro batch keeps the GPU busier, accumulation only repeats it. Written by
        hand: the Trainer and DeepSpeed take the three numbers as given.
        """
        s = "es" if data_parallel != 1 else ""
        per_process = cls.share_per_process(global_batch, data_parallel)
        given = {"--batch_size": micro, "--gradient_accumulation_steps": accumulation}
        given = {flag: value for flag, value in given.items() if value is not None}
        if micro is not None and accumulation is not None:
            if micro * accumulation != per_process:
                raise FinetuneError(
                    f"--global_batch_size {global_batch} disagrees with --batch_size {micro} x "
                    f"--gradient_accumulation_steps {accumulation} x {data_parallel} process{s} = "
                    f"{micro * accumulation * data_parallel}: leave out one of them, or both to have the "
                    "micro batch planned"
                )
            reason = "--batch_size and --gradient_accumulation_steps as given"
        elif given:
            ((flag, value),) = given.items()
            if per_process % value:
                raise FinetuneError(
                    f"--global_batch_size {global_batch} is not a multiple of {flag} {value} x "
                    f"{data_parallel} process{s}: leave out {flag} to have the micro batch planned"
                )
            micro, accumulation = micro or per_process // value, accumulation or per_process // value
            reason = f"{flag} as given"
        else:
            if largest is None:
                raise ValueError("from_global needs the largest micro batch when no batch flag is given")
            limit, why = largest
            micro = max(size for size in range(1, min(limit, per_process) + 1) if per_process % size == 0)
            accumulation = per_process // micro
            reason = f"the largest micro batch that divides {per_process} per process and is {why}"
        return cls(micro, accumulation, data_parallel), reason

    def continued_on(self, data_parallel: int, micro: int) -> BatchGeometry:
        """The same global batch on another number of processes with this micro batch (the checkpoint
        identity keeps it), by the accumulation (`--allow_world_size_change`), or FinetuneError naming
        the counts that can."""
        total = self.global_batch
        if total % (data_parallel * micro):
            workable = [str(n) for n in range(1, total + 1) if total % (n * micro) == 0]
            raise FinetuneError(
                f"--allow_world_size_change: the checkpoint was trained with {self.describe()}; "
                f"{data_parallel} processes with micro batch {micro} cannot make {total} exactly: "
                f"resume on {' or '.join(workable)} processes"
            )
        return BatchGeometry(micro, total // (data_parallel * micro), data_parallel)

    def apply(self, training_args: Any) -> None:
        """Set the run's micro batch and accumulation: the only writer of both.

        Evaluation takes the same micro batch unless --per_device_eval_batch_size says otherwise: it
        keeps no activations for a backward, so a micro batch that trains (the one the planner fits)
        evaluates, where the Trainer's own default of 8 asks a long block that trains one sample at a
        time for eight samples' logits at once.

        A profile's CUDA graphs (the single profile's reduce-overhead) are then switched off where they
        fail: with gradient accumulation, which failed on a GPU at the first backward ("accessing
        tensor output of CUDAGraphs that has been overwritten by a subsequent run"), with gradient
        checkpointing, whose backward runs the recorded forward again (asked for explicitly, that is
        refused when parsing), and under flex attention, whose block mask is a new tensor every batch
        that the graphs hold as a static input: they were recorded again at every step, an order of
        magnitude slower than without them. --torch_compile_mode asks for a mode explicitly: it is
        kept, but graphs asked for over accumulated micro batches are refused (on two GPUs a ddp run
        asking for them, resumed on one with the accumulation doubled, failed at its first backward
        reading an overwritten output). A DeepSpeed JSON given to TrainingArguments (`--deepspeed
        FILE`) had its "auto" batch sizes filled from the old values: it is filled again as
        transformers' own hyperparameter search does, or DeepSpeed would train the old batch. A
        profile's JSON is filled by accelerate later.
        """
        training_args.per_device_train_batch_size = self.micro
        training_args.gradient_accumulation_steps = self.accumulation
        training_args.per_device_eval_batch_size = asked_evaluation_micro_batch(training_args) or self.micro
        flex_attention = training_args.attention_kernel == "flex_attention"
        if self.accumulation > 1 and training_args.torch_compile_mode in CUDA_GRAPH_MODES:
            raise FinetuneError(
                f"--torch_compile_mode {training_args.torch_compile_mode} records CUDA graphs, which "
                f"{self.accumulation} accumulated micro batches break (a replay overwrites the outputs the "
                "backward still reads): use --torch_compile_mode default, or one micro batch a step"
            )
        if (
            not keeps_cuda_graphs(training_args.gradient_checkpointing, self.accumulation, flex_attention)
            and training_args.torch_compile
            and training_args.torch_compile_mode is None
            and os.environ.get("ACCELERATE_DYNAMO_MODE") in CUDA_GRAPH_MODES
        ):
            training_args.torch_compile_mode = "default"
        if getattr(training_args, "hf_deepspeed_config", None) is not None:
            from accelerate.utils import DeepSpeedPlugin
            from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

            training_args.hf_deepspeed_config = HfTrainerDeepSpeedConfig(training_args.deepspeed)
            training_args.hf_deepspeed_config.trainer_config_process(training_args)
            training_args.deepspeed_plugin = DeepSpeedPlugin(hf_ds_config=training_args.hf_deepspeed_config)


def asked_evaluation_micro_batch(training_args: Any) -> int | None:
    """--per_device_eval_batch_size where given; None where evaluation takes the training micro batch
    (`BatchGeometry.apply` says why): the one reading of the rule, for the run and the planner."""
    if "per_device_eval_batch_size" not in training_args.batch_flags_given:
        return None
    return training_args.per_device_eval_batch_size


def compile_mode(training_args: Any) -> str:
    """--torch_compile_mode, else the profile's (accelerate's dynamo_mode), else torch's default."""
    return training_args.torch_compile_mode or os.environ.get("ACCELERATE_DYNAMO_MODE", "default")


def check_cuda_graphs(training_args: Any, strategy: Strategy) -> None:
    """CUDA graphs (--torch_compile_mode, or a profile's dynamo_mode, asking for them) refused in one
    line under FSDP2 and ZeRO-3 (docs/profiles.md). A graph holds its inputs' addresses and FSDP2
    gathers each block's weights into new memory every step, so its compiled blocks were recorded
    again at every step, an order of magnitude slower than without graphs; ZeRO-3's blocks, compiled
    between DeepSpeed's hooks, missed the graphs' fast path while training and failed at evaluation."""
    mode = compile_mode(training_args)
    compiled = training_args.torch_compile or training_args.torch_compile_mode is not None
    if not (compiled and mode in CUDA_GRAPH_MODES and (strategy.framework == "fsdp" or strategy.is_zero3)):
        return
    asked = (
        f"--torch_compile_mode {mode}"
        if training_args.torch_compile_mode is not None
        else f"the profile's dynamo_mode {mode}"
    )
    why = (
        "FSDP2 gathers each block's weights into new memory every step and the graphs were recorded again "
        "at every step"
        if strategy.framework == "fsdp"
        else "ZeRO-3's compiled blocks missed the graphs' fast path and failed at evaluation reading "
        "outputs a later replay had overwritten"
    )
    raise FinetuneError(
        f"{asked} records CUDA graphs, which profile {strategy.name} cannot use ({why}): "
        "use --torch_compile_mode default"
    )


@dataclass(frozen=True)
class CompilePlan:
    """What torch.compile compiles in this run.

    `scope`: none; whole (accelerate compiles the model, or hands it to DeepSpeed's DeepCompile where
    the DeepSpeed JSON asks for it); per_block (accelerate's regional compilation, which every
    shipped profile that compiles through accelerate asks for: FSDP2 compiled whole breaks at its
    hooks, and ddp's and ZeRO-1/2's whole graph ran slower and held more than their blocks); or
    zero3_blocks (finetune compiles ZeRO-3's leaf blocks' forwards, `models.compile_zero3_blocks`:
    compiled through accelerate ZeRO-3 was slower than eager). `mode`: torch.compile's mode. `loss`:
    the loss compiled beside compiled blocks (`--compile_loss`).
    """

    scope: str = "none"
    mode: str | None = None
    loss: bool = False

    @property
    def compiled(self) -> bool:
        return self.scope != "none"

    @property
    def by_accelerate(self) -> bool:
        return self.scope in ("whole", "per_block")

    @property
    def records_cuda_graphs(self) -> bool:
        return self.by_accelerate and self.mode in CUDA_GRAPH_MODES

    @classmethod
    def for_run(cls, launch: Launch, training_args: Any, zero3_leaf_blocks: list[str]) -> CompilePlan:
        """The plan for this run's flags (the compile default already applied) on its strategy; ZeRO-3
        without leaf blocks (a DeepSpeed JSON's own leaf_module, DeepCompile aside) runs eager."""
        if not training_args.torch_compile:
            return cls()
        mode = compile_mode(training_args)
        if launch.strategy.deepcompile:
            scope = "whole"  # accelerate hands the engine to DeepSpeed's compile, DeepCompile's entry
        elif launch.strategy.is_zero3:
            scope = "zero3_blocks" if zero3_leaf_blocks else "none"
        elif launch.strategy.compiles_by_blocks:
            scope = "per_block"
        else:
            scope = "whole"
        loss = bool(getattr(training_args, "compile_loss", False)) and scope in ("per_block", "zero3_blocks")
        return cls(scope, mode if scope != "none" else None, loss)

    @classmethod
    def of_arguments(cls, training_args: Any) -> CompilePlan:
        """For a Trainer built outside run.py: accelerate compiles the whole model when asked."""
        if training_args is None or not training_args.torch_compile:
            return cls()
        return cls("whole", compile_mode(training_args))

    def summary_fields(self) -> dict[str, Any]:
        return {
            "torch_compile": self.compiled,
            "torch_compile_regional": self.scope == "per_block",
            "torch_compile_mode": self.mode if self.by_accelerate else None,
            "loss_compiled": self.loss,
        }


@dataclass(frozen=True)
class Launch:
    """The launch as this process sees it: the strategy and the processes, on GPUs or CPUs."""

    strategy: Strategy
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    processes_per_machine: int = 1
    on_gpu: bool = False
    rank: int = 0
    local_rank: int = 0
    by_launcher: bool = False  # started by torchrun/accelerate launch, even as its only process
    profile: str | None = None  # the name `finetune run`/`compare` launched (None: a bare accelerate launch)
    # the DeepSpeed JSON the launcher named, as read at start-up (None without one)
    deepspeed_config_path: Path | None = None
    deepspeed_config: dict[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def from_environment(cls, sequence_parallel: int = 1) -> Launch:
        """The only reader of the launcher's process variables (and of $FINETUNE_PROFILE and the
        profile's DeepSpeed JSON); `sequence_parallel` is the run's `--sequence_parallel`."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        config_path, deepspeed_config = active_deepspeed_config()
        return cls(
            strategy_from_environment(world_size, deepspeed_config),
            ParallelLayout.from_environment(world_size, sequence_parallel),
            int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size))),
            torch.cuda.is_available(),
            int(os.environ.get("RANK", "0")),
            int(os.environ.get("LOCAL_RANK", "0")),
            "WORLD_SIZE" in os.environ,
            os.environ.get(PROFILE_VARIABLE) or None,
            config_path,
            deepspeed_config,
        )

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def sequence_split(self) -> str | None:
        """The mechanism splitting this run's samples over its groups ("ulysses", "ring"), None
        when each sample stays on one process."""
        return self.strategy.sequence_split if self.layout.sequence_parallel > 1 else None

    @property
    def data_parallel_size(self) -> int:
        return self.layout.data_parallel_size

    @property
    def machines(self) -> int:
        return max(1, self.world_size // self.processes_per_machine)

    @property
    def on_one_machine(self) -> bool:
        return self.processes_per_machine >= self.world_size

    @property
    def several_cpu_ranks(self) -> bool:
        return not self.on_gpu and self.world_size > 1

    @property
    def fsdp_on_cpu(self) -> bool:
        """FSDP on CPU ranks, a single one included: `accelerate launch` starts FSDP through torchrun
        whatever the count, and a 1-process FSDP run must write and read sharded (DCP) checkpoints as
        on one GPU, so that `--allow_world_size_change` can move them to more processes and back."""
        return not self.on_gpu and self.strategy.framework == "fsdp" and self.by_launcher

    @property
    def strategy_name(self) -> str:
        """What the strategy is, whatever the profile file was called: the shipped profile's name."""
        return conventional_name(self.strategy)

    @property
    def distributed_type(self) -> str:
        """accelerate's name for it (DDP on CPU ranks is MULTI_CPU)."""
        framework = self.strategy.framework
        if framework == "ddp":
            return "MULTI_GPU" if self.on_gpu else "MULTI_CPU"
        return {"single": "NO", "fsdp": "FSDP", "deepspeed": "DEEPSPEED"}[framework]

    def strategy_fields(self) -> dict[str, Any]:
        """The run summary's and the checkpoint identity's strategy fields."""
        return {
            "strategy": self.strategy_name,
            "distributed_type": self.distributed_type,
            "zero_stage": self.strategy.zero_stage,
            **self.layout.summary_fields(),
        }

    def check_against(self, accelerator: Any, compile_plan: CompilePlan) -> None:
        """FinetuneError unless accelerate set up this strategy on these processes and compiles what the
        plan says: the run would otherwise record, resume and plan for something other than what ran."""
        built = strategy_of(accelerator)
        if placement(built) != placement(self.strategy) or accelerator.num_processes != self.world_size:
            raise FinetuneError(
                f"the launch was read as {self.strategy_name} on {self.world_size} processes but accelerate "
                f"set up {conventional_name(built)} on {accelerator.num_processes}: a launcher variable "
                "disagrees with the profile (report this with the launch command)"
            )
        dynamo = accelerator.state.dynamo_plugin
        compiled = dynamo.backend != DynamoBackend.NO
        regional = compiled and bool(dynamo.use_regional_compilation)
        expected = (compile_plan.by_accelerate, compile_plan.scope == "per_block")
        if (compiled, regional) != expected or (compiled and dynamo.mode != compile_plan.mode):
            raise FinetuneError(
                f"the compile plan ({compile_plan.scope}, mode {compile_plan.mode}) disagrees with "
                f"accelerate's (compiled {compiled}, regional {regional}, mode {dynamo.mode}): report this "
                "with the command"
            )
