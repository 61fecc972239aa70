"""What the launch decides about the parsed flags, applied once after parsing and touching no device
(`resolve_launch_settings`), then TrainingArguments' own device set-up in the process that trains
(`set_up_devices`). finetune/arguments.py holds what the user asked for; this, what the launched
profile, processes and machine make of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from finetune.arguments import FSDP_BLOCKS_PER_UNIT, FinetuneTrainingArguments
from finetune.build_locks import (
    deepspeed_ops_a_run_builds,
    extensions_root,
    refuse_stale_build_locks,
    unbuilt,
)
from finetune.deepspeed_json import (
    JsonDecidedFlags,
    check_deepspeed_config,
    check_final_model_gathered,
    check_values_match_the_flags,
    needs_nvme_path,
    write_filled_config,
)
from finetune.devices import (
    adapt_arguments_to_cpu,
    apply_collective_timeout,
    check_offload_without_gpu,
    check_precision_without_gpu,
    check_quantized_collectives_without_gpu,
    one_gpu_per_process,
)
from finetune.errors import FinetuneError, lines_joined
from finetune.launched import (
    BatchGeometry,
    Launch,
    check_cuda_graphs,
    mixed_precision,
    precision_on,
    visible_gpu_supports_bf16,
)
from finetune.quiet import DEEPSPEED_OP_LOADED, without_printed_lines
from finetune.sequence_parallel import check_device, check_strategy, parallelism_config


def resolve_launch_settings(training_args: FinetuneTrainingArguments, launch: Launch) -> None:
    """What the launch decides about the flags, applied once after parsing, touching no device.

    The launcher's variables and the machine choose the FSDP units, the compile default, the mixed
    precision of `--precision auto`, the profile's DeepSpeed JSON (checked, and its NVMe folder filled
    in and created), how ranks without a GPU talk and how batches reach a GPU. `finetune doctor`
    resolves the same before its checks (finetune/resolved.py), so it checks the run that would train.
    """
    config_path, deepspeed_config = launch.deepspeed_config_path, launch.deepspeed_config
    if config_path is not None and deepspeed_config is not None:  # a bare accelerate launch checks none
        check_deepspeed_config(config_path, deepspeed_config)
        check_final_model_gathered(config_path, deepspeed_config)
    JsonDecidedFlags.of(training_args).check(config_path, deepspeed_config)
    _apply_fsdp_units(training_args, launch)
    _apply_sequence_parallel(training_args, launch)
    if training_args.torch_compile is None:
        training_args.torch_compile = compiles_by_default(training_args.use_cpu, launch)
    check_cuda_graphs(training_args, launch.strategy)
    BatchGeometry.of(training_args, launch.data_parallel_size).apply(training_args)
    _apply_auto_precision(training_args)
    check_precision_without_gpu(mixed_precision(training_args), launch)
    check_offload_without_gpu(launch)
    check_quantized_collectives_without_gpu(launch)
    _apply_nvme_path(training_args, config_path, deepspeed_config)
    adapt_arguments_to_cpu(training_args, launch)
    _apply_batch_copies(training_args, launch)


def _apply_batch_copies(training_args: FinetuneTrainingArguments, launch: Launch) -> None:
    """On GPUs, batches in page-locked memory copied with accelerate's `non_blocking`: a blocking copy
    waits for the GPU to finish the work queued before it (two host syncs a step in a several-GPU
    trace, one per tensor of the batch), where a copy from page-locked memory queues behind it."""
    if training_args.dataloader_pin_memory is None:
        training_args.dataloader_pin_memory = launch.on_gpu and not training_args.use_cpu
    if training_args.accelerator_config is None and training_args.dataloader_pin_memory:
        training_args.accelerator_config = {"non_blocking": True}


def set_up_devices(training_args: FinetuneTrainingArguments, launch: Launch) -> None:
    """TrainingArguments' own __post_init__, which sets up the devices (and starts DeepSpeed) from
    the resolved flags: in the process that trains, after `resolve_launch_settings`."""
    if launch.deepspeed_config_path is not None or training_args.deepspeed:  # before its first op build
        refuse_stale_build_locks(launch.on_one_machine)
        announce_first_builds(launch, launch.deepspeed_config or {})
    try:
        with without_printed_lines(DEEPSPEED_OP_LOADED):  # the device set-up starts DeepSpeed
            TrainingArguments.__post_init__(training_args)
    except ValueError as error:  # its checks of the flags, a few lines each
        raise FinetuneError(lines_joined(error)) from None
    if launch.deepspeed_config_path is not None and launch.deepspeed_config is not None:
        check_values_match_the_flags(launch.deepspeed_config_path, launch.deepspeed_config, training_args)
    apply_collective_timeout(training_args)
    one_gpu_per_process(training_args, launch)


def announce_first_builds(launch: Launch, deepspeed_config: dict[str, Any]) -> None:
    """One line per machine before DeepSpeed compiles an op for the first time there (silent otherwise)."""
    ops = unbuilt(deepspeed_ops_a_run_builds(launch.on_gpu, deepspeed_config))
    if ops and launch.local_rank == 0:
        print(
            f"finetune: DeepSpeed compiles {', '.join(ops)} on first use on this machine: a minute or "
            f"more, once (later runs reuse it from {extensions_root()})",
            flush=True,
        )


def _apply_sequence_parallel(training_args: FinetuneTrainingArguments, launch: Launch) -> None:
    """`--sequence_parallel N` as the Trainer takes it: accelerate's ParallelismConfig for the
    profile's mechanism (finetune/sequence_parallel.py: DeepSpeed's Ulysses under ZeRO-3, torch's
    ring attention under FSDP2); refused in one line under any other profile, and the ring off CUDA."""
    degree, split = launch.layout.sequence_parallel, launch.strategy.sequence_split
    check_strategy(launch.strategy, degree)
    check_device(split, degree, launch.on_gpu)
    if degree > 1:
        training_args.parallelism_config = parallelism_config(degree, split, launch.world_size)


def _apply_fsdp_units(training_args: FinetuneTrainingArguments, launch: Launch) -> None:
    """The FSDP profiles' blocks per unit by default; the unit flags refused in one line where there
    are no FSDP units to group or prefetch."""
    fsdp = launch.strategy.framework == "fsdp"
    if training_args.fsdp_blocks_per_unit is None:
        training_args.fsdp_blocks_per_unit = FSDP_BLOCKS_PER_UNIT if fsdp else 1
    if fsdp:
        return
    asked = [
        flag
        for flag, changed in (
            ("--fsdp_blocks_per_unit", training_args.fsdp_blocks_per_unit != 1),
            ("--fsdp_prefetch", training_args.fsdp_prefetch != 0),
        )
        if changed
    ]
    if asked:
        raise FinetuneError(
            f"{asked[0]} is for the FSDP profiles; profile {launch.strategy.name} "
            f"({launch.strategy.framework}) has no FSDP units"
        )


def _apply_auto_precision(training_args: FinetuneTrainingArguments) -> None:
    precision = precision_on(training_args, visible_gpu_supports_bf16())
    training_args.bf16, training_args.fp16 = precision == "bf16", precision == "fp16"


def _apply_nvme_path(
    training_args: FinetuneTrainingArguments, config_path: Path | None, config: dict[str, Any] | None
) -> None:
    """ZeRO-Infinity needs a folder only the user knows: fill it into the profile's DeepSpeed JSON.

    The filled JSON goes to accelerate the way every other profile's does, as the launcher's
    ACCELERATE_DEEPSPEED_CONFIG_FILE, not as TrainingArguments.deepspeed: transformers fills that
    one's "auto" batch sizes in __post_init__ from a world size it may not know yet (1 on CPU gloo
    ranks), and DeepSpeed then refuses the batch of 2 ranks.
    """
    if config is None or not needs_nvme_path(config):
        return
    Path(training_args.nvme_path).mkdir(parents=True, exist_ok=True)
    os.environ["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = str(write_filled_config(config, training_args.nvme_path))


def compiles_by_default(use_cpu: bool, launch: Launch) -> bool:
    """The launched strategy's compile default (`Strategy.compiled_by_default`), on a GPU only: on CPU
    compiling only adds compile time."""
    return launch.on_gpu and not use_cpu and launch.strategy.compiled_by_default
