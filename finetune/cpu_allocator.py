"""torch's CPU allocator, set before torch loads: it reads its settings once, at the first allocation.

A step on CPU allocates and frees tensors of tens to hundreds of megabytes (the logits over GPT-2's
vocabulary among them). glibc maps each such allocation anew and unmaps it when freed, so the kernel
faults every 4 KiB page of it in again, every step: a good part of what the CPU quick start's step
waited on (docs/speed.md, "CPU"). torch's own `THP_MEM_ALLOC_ENABLE=1` aligns allocations of 2 MiB
and more to huge pages and asks the kernel for them (`madvise`), which faults 512 times fewer pages.
It is torch's opt-in; finetune opts in where no GPU is visible, and leaves GPU machines (whose host
tensors are the batches, the checkpoints and offloaded states) as torch has them until measured
there. A value the user set, 0 included, is kept.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

HUGE_PAGES_VARIABLE = "THP_MEM_ALLOC_ENABLE"
# One entry per NVIDIA GPU the driver knows; readable without CUDA or torch.
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def gpus_visible(environment: MutableMapping[str, str], driver_gpus: Path = NVIDIA_GPUS) -> bool:
    """Whether this process could use an NVIDIA GPU, told without loading CUDA."""
    visible = environment.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return driver_gpus.is_dir() and any(driver_gpus.iterdir())


def huge_pages_without_gpus(
    environment: MutableMapping[str, str] = os.environ, driver_gpus: Path = NVIDIA_GPUS
) -> None:
    """Opts torch's CPU allocator into huge pages on a machine (or process) without GPUs; the
    processes launched from this one inherit it."""
    if not gpus_visible(environment, driver_gpus):
        environment.setdefault(HUGE_PAGES_VARIABLE, "1")
