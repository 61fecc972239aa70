"""A build lock left by a killed process is one line, not an endless wait.

torch builds C++/CUDA extensions (DeepSpeed's ops, on first use) under one `lock` file per op,
created with O_EXCL and kept open by the building process until it removes it. A process killed
mid-build leaves the file, and every later build of that op waits for it forever (torch's
`FileBaton.wait`, no time limit): a ZeRO run hangs after "Setting accelerator to CPU" with no word.
Before a DeepSpeed run builds anything, each lock is checked for a process that holds it open; one
that nobody holds is stale. No library offers this check.

On several machines sharing a home directory the holder may be on another machine, where this one
cannot see it: there a lock counts as stale only once it is older than any build takes.

A first build takes a minute or more without a word from DeepSpeed: `unbuilt` lets the run say so
before it starts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil

from finetune.errors import FinetuneError

SHARED_LOCK_STALE_AFTER_S = 1800.0
RECHECK_AFTER_S = 0.5  # a build that has just finished closes its lock a moment before removing it


def extensions_root() -> Path:
    """Where torch.utils.cpp_extension builds: `$TORCH_EXTENSIONS_DIR`, else its default under ~/.cache."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "torch_extensions"


def holders(path: Path) -> list[psutil.Process]:
    """The processes of this machine (that we may inspect) that have `path` open."""
    target = str(path.resolve())
    found = []
    for process in psutil.process_iter():
        try:
            if any(opened.path == target for opened in process.open_files()):
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def held_open(path: Path) -> bool:
    return bool(holders(path))


def held_by_stopped_processes(root: Path) -> tuple[Path, list[int]] | None:
    """A build lock whose every holder is stopped (Ctrl-Z, SIGSTOP): a build waits for it as long as
    they stay stopped, with no word. The first such lock and its holders' pids, or None."""
    for lock in (path for pattern in ("*/lock", "*/*/lock") for path in root.glob(pattern)):
        held = holders(lock)
        try:
            if held and all(process.status() == psutil.STATUS_STOPPED for process in held):
                return lock, [process.pid for process in held]
        except psutil.NoSuchProcess:
            continue
    return None


def stale_build_locks(root: Path, one_machine: bool = True) -> list[Path]:
    locks = [path for pattern in ("*/lock", "*/*/lock") for path in root.glob(pattern)]
    if not locks:
        return []
    time.sleep(RECHECK_AFTER_S)
    stale = []
    for lock in locks:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:  # released meanwhile
            continue
        if not held_open(lock) and (one_machine or age > SHARED_LOCK_STALE_AFTER_S):
            stale.append(lock)
    return stale


def build_lock_problem(one_machine: bool) -> str | None:
    """The first build lock under the extensions folder that a build would wait on forever, said in
    one line: left by a dead process, or held only by stopped ones; None if there is none."""
    root = extensions_root()
    stale = stale_build_locks(root, one_machine)
    if stale:
        return (
            f"{stale[0]} is a build lock left by a process that no longer runs (killed while building "
            f"{stale[0].parent.name}); every DeepSpeed run would wait for it forever: remove it "
            f"(rm {stale[0]}) and run again"
        )
    stopped = held_by_stopped_processes(root)
    if stopped:
        lock, pids = stopped
        listed = " ".join(map(str, pids))
        return (
            f"{lock} is held by stopped process(es) {listed} (Ctrl-Z?): a DeepSpeed build waits for it as "
            f"long as they stay stopped: continue them (kill -CONT {listed}) or end them, and run again"
        )
    return None


def refuse_stale_build_locks(one_machine: bool) -> None:
    """FinetuneError for a build lock a build would wait on forever (`build_lock_problem`)."""
    problem = build_lock_problem(one_machine)
    if problem:
        raise FinetuneError(problem)


# ZeRO++'s quantized collectives, read by stage 3 only: int8 weight all-gathers (qwZ), weights kept
# quantized, int4 gradient all-to-all reduction (qgZ); each runs DeepSpeed's quantizer op, built on
# first use, which has kernels for CUDA only
QUANTIZED_COLLECTIVE_KEYS = (
    "zero_quantized_weights",
    "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients",
)


def quantized_collectives(config: dict[str, Any]) -> list[str]:
    """The ZeRO++ quantizations the JSON turns on where DeepSpeed reads them (stage 3)."""
    zero = config.get("zero_optimization", {})
    if zero.get("stage") != 3:
        return []
    return [key for key in QUANTIZED_COLLECTIVE_KEYS if zero.get(key) is True]


def deepspeed_ops_a_run_builds(on_gpu: bool, deepspeed_config: dict[str, Any]) -> list[str]:
    """The ops DeepSpeed compiles when a run starts, by their build folders' names: its shared-memory
    collectives wherever it runs on CPU, CPU Adam where the optimizer is offloaded, async I/O where
    anything goes to NVMe, the quantizer for ZeRO++'s quantized collectives (GPUs only)."""
    zero = deepspeed_config.get("zero_optimization", {})
    devices = {zero.get(section, {}).get("device") for section in ("offload_optimizer", "offload_param")}
    ops = [] if on_gpu else ["deepspeed_shm_comm"]
    if devices & {"cpu", "nvme"}:
        ops.append("cpu_adam")
    if "nvme" in devices:
        ops.append("async_io")
    if on_gpu and quantized_collectives(deepspeed_config):
        ops.append("quantizer")
    return ops


def unbuilt(ops: list[str]) -> list[str]:
    """Those of `ops` torch has not built under the extensions folder yet (their first build is slow)."""
    root = extensions_root()
    return [op for op in ops if not any(root.glob(f"*/{op}/{op}.so"))]
