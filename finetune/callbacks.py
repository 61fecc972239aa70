"""Trainer callbacks that measure a run's memory per rank and its start-up (its throughput is
finetune/throughput.py's; the console lines that show them, finetune/console.py's).

`MemoryCallback.log_scalars()` (every logging step) and its `on_train_end` gather across ranks, so they
are collective: the Trainer calls both on every rank at the same point (`FinetuneTrainer.log` only
asks for scalars on the training-loss log, which every rank reaches after the loss all-gather).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psutil
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from finetune.collectives import gather_from_ranks

GIB = 2**30  # the unit memory is measured, logged and planned in
T = TypeVar("T")


def across_ranks(values: list[float]) -> dict[str, float | int]:
    """The highest value, which rank had it, and the mean: what a per-GPU budget needs."""
    highest = max(range(len(values)), key=values.__getitem__)
    return {"max": values[highest], "rank": highest, "mean": sum(values) / len(values)}


# ---------------------------------------------------------------------------------------------------
# Memory


def host_memory() -> dict[str, float]:
    """This process's resident memory now, and its peak since the process started (GiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_bytes = peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB
    return {"host_rss": psutil.Process().memory_info().rss / GIB, "host_peak_rss": peak_bytes / GIB}


def device_memory() -> dict[str, float]:
    """PyTorch's CUDA caching allocator on this rank's device (GiB); peaks since the last reset."""
    return {
        "allocated": torch.cuda.memory_allocated() / GIB,
        "reserved": torch.cuda.memory_reserved() / GIB,
        "peak_allocated": torch.cuda.max_memory_allocated() / GIB,
        "peak_reserved": torch.cuda.max_memory_reserved() / GIB,
    }


def read_memory() -> dict[str, float]:
    return {**(device_memory() if torch.cuda.is_available() else {}), **host_memory()}


class MemoryCallback(TrainerCallback):
    """Per-rank memory: set-up peak, training peak, and (with `profile_phases`) the first step's phases.

    The CUDA peak counters are reset when training begins, after the model is placed and wrapped
    and the optimizer is built, so `peak_allocated` is the training peak and the set-up peak is
    kept apart. Host RSS is always read: it is the memory on CPU runs and what the offload
    profiles move state into.
    """

    def __init__(self, profile_phases: bool = False, read: Callable[[], dict[str, float]] = read_memory):
        self.read = read
        self.profile_phases = profile_phases
        self.setup: dict[str, float] = {}
        self.phases: list[tuple[str, dict[str, float]]] = []
        self.ranks: list[dict[str, Any]] = []
        self._forward_hook: torch.utils.hooks.RemovableHandle | None = None

    def mark_phase(self, name: str) -> None:
        if self.profile_phases:
            self.phases.append((name, self.read()))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.setup = self.read()
        self.mark_phase("set-up (model placed, wrapped, optimizer built)")
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        model = kwargs.get("model")
        if self.profile_phases and model is not None:
            self._forward_hook = model.register_forward_hook(self._after_first_forward)

    def _after_first_forward(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if module.training and self._forward_hook is not None:
            self.mark_phase("first forward")
            self._forward_hook.remove()
            self._forward_hook = None

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if state.global_step == 0:
            self.mark_phase("first backward")

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if state.global_step == 0:
            self.mark_phase("first optimizer step")

    def log_scalars(self) -> dict[str, float]:
        """Max and mean over ranks of every reading, as `memory/<reading>_gib_{max,mean}`. Collective."""
        readings = gather_from_ranks(self.read())
        scalars = {}
        for key in readings[0]:
            spread = across_ranks([reading[key] for reading in readings])
            scalars[f"memory/{key}_gib_max"] = spread["max"]
            scalars[f"memory/{key}_gib_mean"] = spread["mean"]
        return scalars

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        local = {"end": self.read(), "setup": self.setup, "phases": self.phases}
        self.ranks = gather_from_ranks(local)

    def summary(self) -> dict[str, Any]:
        """Flat run-summary fields (see summary.FIELDS); empty before training ended."""
        if not self.ranks:
            return {}
        end = [rank["end"] for rank in self.ranks]
        fields: dict[str, Any] = {"memory_device": "cuda" if "allocated" in end[0] else "cpu"}
        for key in ("peak_allocated", "peak_reserved", "host_peak_rss"):
            if key in end[0]:
                spread = across_ranks([reading[key] for reading in end])
                fields[f"memory_{key}_gib_max"] = spread["max"]
                fields[f"memory_{key}_gib_mean"] = spread["mean"]
                fields[f"memory_{key}_rank"] = spread["rank"]
        for key in ("allocated", "reserved", "host_rss"):
            if key in end[0]:
                fields[f"memory_{key}_gib_max"] = max(reading[key] for reading in end)
        if "peak_allocated" in self.ranks[0]["setup"]:
            fields["memory_setup_peak_allocated_gib_max"] = max(
                rank["setup"]["peak_allocated"] for rank in self.ranks
            )
        return fields

    def report(self) -> str:
        """The --profile_memory printout: every rank's readings, then each phase of the first step."""

        def readings(values: dict[str, float]) -> str:
            return ", ".join(f"{key} {value:.2f}" for key, value in values.items())

        lines = ["finetune: memory per rank at the end of training, GiB (GPU peaks since training began)"]
        for index, rank in enumerate(self.ranks):
            lines.append(f"  rank {index}: {readings(rank['end'])}; set-up: {readings(rank['setup'])}")
        lines.append(
            "finetune: memory by phase of the first step, GiB (DeepSpeed steps its optimizer inside backward)"
        )
        for index, rank in enumerate(self.ranks):
            lines += [f"  rank {index}, {name}: {readings(values)}" for name, values in rank["phases"]]
        return "\n".join(lines)

    def evaluation_peak(
        self, evaluate: Callable[[], T], reset: Callable[[], None] | None = None
    ) -> tuple[T, dict]:
        """`evaluate()`'s result, and its GPU peak of allocated tensors, max over ranks, as the summary
        field memory_eval_peak_allocated_gib_max (None without CUDA): a long block's evaluation holds
        its full logits where training may not (--chunked_loss), so it can be the run's peak. Read
        after training's peak is recorded; the CUDA peak counters restart for it. Collective."""
        if reset is None and torch.cuda.is_available():
            reset = torch.cuda.reset_peak_memory_stats
        if reset is not None:
            reset()
        result = evaluate()
        peaks = [peak for peak in gather_from_ranks(self.read().get("peak_allocated")) if peak is not None]
        return result, {"memory_eval_peak_allocated_gib_max": max(peaks) if peaks else None}

    def per_rank(self) -> list[dict[str, float]]:
        return [{f"{key}_gib": value for key, value in rank["end"].items()} for rank in self.ranks]


# ---------------------------------------------------------------------------------------------------
# Start-up


def process_start_time() -> float:
    """When this process started, on the wall clock: imports and library set-up count too."""
    return psutil.Process().create_time()


class StartupCallback(TrainerCallback):
    """Seconds from the process's start to the end of its first optimizer step: imports, data, model,
    wrapping, compilation and that step, what a user waits before training runs at speed; and that
    time by phase, which says what to shorten.

    run.py marks where its set-up phases end (`mark`); the Trainer's wrapping ends at train begin,
    and the first step (compilation in it) at its end. On a GPU the first step's end waits for the GPU
    once, so the time is the step's, not its queueing. A resumed run counts its own start-up (loading
    the checkpoint included).
    """

    def __init__(
        self,
        started_at: float | None = None,
        clock: Callable[[], float] = time.time,
        on_gpu: bool | None = None,
    ):
        self.started_at = process_start_time() if started_at is None else started_at
        self.clock = clock
        self.on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
        self.seconds: float | None = None
        self.marks: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        """The phase that ends now (the first ends at the first mark, measured from the process start)."""
        self.marks.append((phase, self.clock()))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.seconds is None:
            self.mark("wrapping")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.seconds is not None:
            return
        if self.on_gpu:
            torch.cuda.synchronize()
        self.mark("first step")
        self.seconds = self.marks[-1][1] - self.started_at

    def phases(self) -> dict[str, float]:
        """Seconds each phase took, in order; they add up to the time to the first step."""
        starts = [self.started_at, *(at for _, at in self.marks[:-1])]
        return {phase: end - start for (phase, end), start in zip(self.marks, starts, strict=True)}

    def summary(self) -> dict[str, Any]:
        """Run-summary fields (see summary.FIELDS); null before the first step ended."""
        if self.seconds is None:
            return {"time_to_first_step_s": None, "startup_phases_s": None}
        return {"time_to_first_step_s": self.seconds, "startup_phases_s": self.phases()}
