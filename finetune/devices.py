"""Run the GPU profiles as real multi-process jobs on machines without a GPU (tests, CI, laptops).

Launched with a GPU profile on a CPU-only machine, accelerate picks no process-group backend, so
each rank would silently train alone. These two adjustments give every profile its real semantics
over gloo: DDP becomes accelerate's MULTI_CPU DDP, DeepSpeed gets an explicit gloo backend, and
FSDP2 is promoted the way accelerate promotes it on GPUs. On a GPU machine they do nothing; there
a lone process trains on one GPU (`one_gpu_per_process`); what CUDA and NCCL read at their start is
set by `import finetune` (finetune/startup_environment.py).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType

from finetune.build_locks import quantized_collectives
from finetune.errors import FinetuneError

if TYPE_CHECKING:  # transformers' classes cost every `finetune` command seconds to import
    from transformers import TrainingArguments

    from finetune.launched import Launch


def adapt_arguments_to_cpu(args: TrainingArguments, launch: Launch) -> None:
    """Before the process group exists: choose gloo the way each profile needs it, and say a lone
    process without a GPU trains on the CPU."""
    if launch.fsdp_on_cpu:
        args.ddp_backend = "gloo"
        return
    if not launch.on_gpu and not launch.strategy.multi_process:
        args.use_cpu = True  # what the run is anyway; transformers refuses bf16 without it ("bf16/gpu")
        return
    if not launch.several_cpu_ranks:
        return
    if launch.strategy.framework == "deepspeed":
        args.ddp_backend = "gloo"
    else:
        args.use_cpu = True


def check_precision_without_gpu(precision: str, launch: Launch) -> None:
    """Mixed precision the profile's ranks cannot train in without a GPU, refused before the device
    set-up: DeepSpeed's CPU accelerator takes no fp16 (a traceback on every rank), and transformers
    takes bf16 off GPUs only as `use_cpu`, which would turn DeepSpeed and FSDP off (its error asks for
    exactly that). The single and ddp profiles train on CPUs in both."""
    framework = launch.strategy.framework
    refused = {"deepspeed": ("fp16", "bf16"), "fsdp": ("bf16",)}.get(framework, ())
    if launch.on_gpu or precision not in refused:
        return
    raise FinetuneError(
        f"--precision {precision}: profile {launch.strategy_name} ({framework}) trains in {precision} on "
        "GPUs only; without a GPU pass --precision fp32 (--precision auto chooses it), or try "
        f"{precision} on the CPU under the single or ddp profile"
    )


def check_offload_without_gpu(launch: Launch) -> None:
    """FSDP2's parameter offload moves the states from a GPU to CPU memory (torch's CPUOffloadPolicy),
    which asks for the accelerator on every rank: without a GPU a traceback on each. DeepSpeed's
    offload profiles run on CPU ranks."""
    if launch.on_gpu or launch.strategy.framework != "fsdp" or not launch.strategy.offloaded:
        return
    raise FinetuneError(
        f"profile {launch.strategy_name}: fsdp_config.fsdp_offload_params moves FSDP2's states from a GPU to "
        "CPU memory and needs a GPU: without one set it false (the states are in CPU memory already)"
    )


def check_quantized_collectives_without_gpu(launch: Launch) -> None:
    """ZeRO++'s quantized collectives run DeepSpeed's quantizer op, which has CUDA kernels only: off
    a GPU it raises from inside zero.Init on every rank."""
    asked = quantized_collectives(launch.deepspeed_config or {})
    if asked and not launch.on_gpu:
        raise FinetuneError(
            f"{launch.deepspeed_config_path}: zero_optimization.{asked[0]}: ZeRO++'s quantized "
            "collectives run on CUDA GPUs only (DeepSpeed's quantizer op has no CPU kernels): set it false "
            "on this machine"
        )


def apply_collective_timeout(args: TrainingArguments) -> None:
    """After the process group exists: --ddp_timeout for every rank. transformers passes it to the
    process group except on `use_cpu` ranks (CPU DDP), which kept torch's 30-minute default."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.distributed_c10d._set_pg_timeout(timedelta(seconds=args.ddp_timeout))


def one_gpu_per_process(args: TrainingArguments, launch: Launch) -> None:
    """After TrainingArguments set up the devices: a lone process trains on one GPU, as the single
    profile says. transformers gives a process launched without distribution every visible GPU
    (n_gpu > 1) and the Trainer then wraps the model in nn.DataParallel: replicas in threads, slower
    than DDP, its memory unmeasured and the token counters raced. The Trainer's own model-parallel
    path sets `_n_gpu = 1` the same way."""
    if launch.on_gpu and args.n_gpu > 1:
        print(
            f"finetune: {launch.strategy_name} trains on one GPU of the {args.n_gpu} visible "
            f"({args.device}); a profile of several processes (ddp, fsdp, zero*) uses them all"
        )
        args._n_gpu = 1


def promote_cpu_fsdp(launch: Launch) -> None:
    """After the process group exists, before the Accelerator: let accelerate enable FSDP on CPU ranks."""
    if launch.fsdp_on_cpu:
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU


def _indexed_cpu_location(storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage | None:
    return storage if re.fullmatch(r"cpu:\d+", location) else None


def load_onto_indexed_cpu(launch: Launch) -> None:
    """Let torch.load map onto `cpu:0`, the device TrainingArguments reports for CPU DDP ranks.

    The Trainer resumes a multi-process run with `map_location=args.device`; torch only knows the
    location "cpu", so resuming DDP on CPU ranks would fail. Registered only on CPU multi-process runs.
    """
    if launch.several_cpu_ranks:
        torch.serialization.register_package(11, lambda obj: None, _indexed_cpu_location)
