"""What torch, CUDA and NCCL read once, at their start: set by `import finetune`, before torch loads.

Each setting is made only where the user set none of its names, and the processes launched from this
one (accelerate's ranks) inherit it. It has to come before torch loads, not at the top of run.py's
`main`: CUDA reads its allocator's settings when it starts, and importing a library can start it
(transformers' model classes import torchao where it is installed, for its quantizer, and
torchao's import does), after which a setting made in `main` is silently never read.

- Without a GPU: torch's CPU allocator on huge pages. A step on CPU allocates and frees tensors of tens
  to hundreds of megabytes (the logits over GPT-2's vocabulary among them). glibc maps each such
  allocation anew and unmaps it when freed, so the kernel faults every 4 KiB page of it in again,
  every step: a good part of what the CPU quick start's step waited on (docs/speed.md, "CPU").
  torch's own `THP_MEM_ALLOC_ENABLE=1` aligns allocations of 2 MiB and more to huge pages and asks the
  kernel for them (`madvise`), which faults 512 times fewer pages. GPU machines' host tensors (the
  batches, checkpoints and offloaded states) stay as torch has them until measured there.
- With a GPU: the CUDA caching allocator's expandable segments, and NCCL's flight recorder, which the
  watchdog dumps. Without expandable segments a long block's activations, freed and allocated in
  sizes that change from layer to layer, leave reserved blocks too fragmented to reuse: a run the
  planner says fits ran out of memory with a quarter of the GPU reserved and unallocated, and trained
  with them (docs/long-context.md). torchtitan's launcher sets the same.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HUGE_PAGES_VARIABLE = "THP_MEM_ALLOC_ENABLE"
# Each pair: the name torch 2.9+ reads first, then the older name it still reads (with a warning).
ALLOCATOR_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
EXPANDABLE_SEGMENTS = "expandable_segments:True"
FLIGHT_RECORDER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_ENTRIES = "2000"
# One entry per NVIDIA GPU the driver knows; readable without CUDA or torch.
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def gpus_visible(environment: MutableMapping[str, str], driver_gpus: Path = NVIDIA_GPUS) -> bool:
    """Whether this process could use an NVIDIA GPU, told without loading CUDA."""
    visible = environment.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return driver_gpus.is_dir() and any(driver_gpus.iterdir())


def torch_renamed_its_variables() -> bool:
    """torch 2.9 renamed the allocator's and the flight recorder's variables; read without importing it."""
    try:
        major, minor = (int(part) for part in version("torch").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return True
    return (major, minor) >= (2, 9)


def set_startup_environment(
    environment: MutableMapping[str, str] = os.environ,
    driver_gpus: Path = NVIDIA_GPUS,
    renamed: bool | None = None,
) -> None:
    """The defaults above, for this process and the ones it launches."""
    if not gpus_visible(environment, driver_gpus):
        environment.setdefault(HUGE_PAGES_VARIABLE, "1")
        return
    renamed = torch_renamed_its_variables() if renamed is None else renamed
    for names, value in (
        (ALLOCATOR_VARIABLES, EXPANDABLE_SEGMENTS),
        (FLIGHT_RECORDER_VARIABLES, FLIGHT_RECORDER_ENTRIES),
    ):
        if not any(environment.get(name) for name in names):
            environment[names[0] if renamed else names[1]] = value
