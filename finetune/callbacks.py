"""Trainer callbacks that measure a run: memory per rank, steady-state throughput, start-up (the
console lines that show them are finetune/console.py's).

Each callback measures on its own rank. `log_scalars()` (every logging step) and `on_train_end`
gather across ranks, so they are collective: the Trainer calls both on every rank at the same point
(`FinetuneTrainer.log` only asks for scalars on the training-loss log, which every rank reaches
after the loss all-gather).
"""

from __future__ import annotations

import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import psutil
import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from finetune.data_formats import IGNORE_INDEX
from finetune.flops import PeakFlops, mfu
from finetune.layout import ParallelLayout

GIB = 2**30  # the unit memory is measured, logged and planned in


T = TypeVar("T")


def gather_from_ranks(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (a one-item list when not distributed). Collective."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


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
# Throughput


def packed_padding(position_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Padding tokens of blocks packed by finetune/packing.py, which carry no attention mask.

    A block's padding is its tail after the last position-id restart, told apart from a last
    example by having no label: every packed example has at least one (finetune.data drops those
    without)."""
    length = position_ids.shape[-1]
    index = torch.arange(length, device=position_ids.device)
    last_start = torch.where(position_ids == 0, index, 0).amax(dim=-1)
    tail = index >= last_start[:, None]
    labelled_tail = ((labels != IGNORE_INDEX) & tail).any(dim=-1)
    return torch.where(labelled_tail, 0, length - last_start).sum()


def tokens_in(batch: dict[str, Any]) -> torch.Tensor | int:
    """Real input tokens of a batch, padding excluded: those the attention mask keeps (padded text and
    examples), every token of a packed block but its padding tail, every token of a full text block."""
    if batch.get("attention_mask") is not None:
        return batch["attention_mask"].sum()
    if batch.get("position_ids") is not None and batch.get("labels") is not None:
        return batch["input_ids"].numel() - packed_padding(batch["position_ids"], batch["labels"])
    return batch["input_ids"].numel()


def trained_tokens_in(batch: dict[str, Any]) -> torch.Tensor | int:
    """Tokens the loss is on: labels other than IGNORE_INDEX after each row's first, which the model's
    shift leaves without a prediction (instruction data: the answer tokens). A sequence-parallel
    rank's slice carries its labels already shifted (`shift_labels`), each of them trained."""
    if batch.get("shift_labels") is not None:
        return (batch["shift_labels"] != IGNORE_INDEX).sum()
    if batch.get("labels") is None:
        return 0
    return (batch["labels"][..., 1:] != IGNORE_INDEX).sum()


def samples_in(batch: dict[str, Any]) -> int:
    key = "labels" if batch.get("labels") is not None else "input_ids"
    return int(batch[key].shape[0])


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


class WallClock:
    """Marks on the host clock: a step's time is what the host saw between two step ends."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock

    def mark(self) -> float:
        return self.clock()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaEventClock:
    """Marks on the GPU's own timeline, read only when the rates are asked for.

    An event recorded at a step end completes when the GPU has finished that step's work, so the
    time between two such events is the step's time on the GPU, idle gaps included, without a
    synchronize at every step (which would stop the host from queueing the next step meanwhile).
    """

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000


SLOWEST_STEPS_KEPT = 5  # per rank in the summary: enough to find a stall, short on a long run


class ThroughputCallback(TrainerCallback):
    """Steady-state samples/s and tokens/s over training steps only.

    A step's time is the interval between consecutive `on_step_end`s (the first from its
    `on_step_begin`), so it includes data loading and every micro-batch of gradient accumulation.
    Left out: the first `warmup_steps` steps, any interval that contained an evaluation or a
    checkpoint save, and everything before the first step. Tokens and samples are counted by a
    forward pre-hook on the model in training mode, so they are exactly what entered the model
    on this rank, padding excluded, beside the tokens the loss is on (on instruction data, the
    answers: `trained_tokens_per_second`). Steps are marked with CUDA events on GPUs (see CudaEventClock)
    and resolved into times and counts at logging steps and at the end.
    """

    def __init__(
        self,
        warmup_steps: int,
        layout: ParallelLayout,
        token_flops: int | None = None,
        peak: PeakFlops | None = None,
        stopwatch: WallClock | CudaEventClock | None = None,
    ):
        self.warmup_steps = warmup_steps
        self.layout = layout
        self.token_flops = token_flops
        self.peak = peak
        self.stopwatch = stopwatch or (CudaEventClock() if torch.cuda.is_available() else WallClock())
        self.steps = 0
        self.step_times: list[float] = []
        self.step_numbers: list[int] = []
        self.step_tokens: list[int] = []
        self.step_trained_tokens: list[int] = []
        self.step_samples: list[int] = []
        self.ranks: list[dict[str, Any]] = []
        self.run_rates: dict[str, float] = {}
        self._logged_upto = 0
        self._unresolved: list[tuple[int, Any, Any, torch.Tensor | int, torch.Tensor | int, int]] = []
        self._pending_tokens: torch.Tensor | int = 0
        self._pending_trained_tokens: torch.Tensor | int = 0
        self._pending_samples = 0
        self._last_mark: Any = None
        self._interrupted = False
        self._hook: torch.utils.hooks.RemovableHandle | None = None

    def count_batch(self, batch: dict[str, Any]) -> None:
        self._pending_tokens = self._pending_tokens + tokens_in(batch)
        self._pending_trained_tokens = self._pending_trained_tokens + trained_tokens_in(batch)
        self._pending_samples += samples_in(batch)

    def _count_forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if module.training:
            self.count_batch(kwargs)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        model = kwargs.get("model")
        if model is not None:
            self._hook = model.register_forward_pre_hook(self._count_forward, with_kwargs=True)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._last_mark is None:
            self._last_mark = self.stopwatch.mark()

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._interrupted = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._interrupted = True

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        now = self.stopwatch.mark()
        self.steps += 1
        if self.steps > self.warmup_steps and not self._interrupted and self._last_mark is not None:
            self._unresolved.append(
                (
                    state.global_step,
                    self._last_mark,
                    now,
                    self._pending_tokens,
                    self._pending_trained_tokens,
                    self._pending_samples,
                )
            )
        self._pending_tokens, self._pending_trained_tokens, self._pending_samples = 0, 0, 0
        self._interrupted = False
        self._last_mark = now

    def _resolve(self) -> None:
        """Turn the marked steps into times and counts (waits for the GPU to reach the last mark)."""
        for step, start, end, tokens, trained, samples in self._unresolved:
            self.step_numbers.append(step)
            self.step_times.append(self.stopwatch.seconds(start, end))
            self.step_tokens.append(int(tokens))
            self.step_trained_tokens.append(int(trained))
            self.step_samples.append(samples)
        self._unresolved.clear()

    def rates(self, local: dict[str, Any]) -> dict[str, float]:
        """Rates over one window measured on every rank. Collective.

        Tokens and samples are summed over ranks (a sample once, however many ranks of its sequence
        group saw a part of it); the window's time is the slowest rank's; per device is per process.
        """
        windows = gather_from_ranks(local)
        seconds = max(window["seconds"] for window in windows)
        if seconds <= 0:
            return {}
        devices = self.layout.devices
        tokens_per_second = sum(window["tokens"] for window in windows) / seconds
        trained_tokens_per_second = sum(window["trained_tokens"] for window in windows) / seconds
        samples_per_second = (
            self.layout.samples_from_ranks(sum(window["samples"] for window in windows)) / seconds
        )
        rates = {
            "samples_per_second": samples_per_second,
            "samples_per_second_per_device": samples_per_second / devices,
            "tokens_per_second": tokens_per_second,
            "tokens_per_second_per_device": tokens_per_second / devices,
            "trained_tokens_per_second": trained_tokens_per_second,
        }
        if self.token_flops is not None:
            rates["achieved_tflops_per_device"] = (
                self.token_flops * rates["tokens_per_second_per_device"] / 1e12
            )
            rates["mfu"] = mfu(self.token_flops, rates["tokens_per_second_per_device"], self.peak)
        return rates

    def _window(self, start: int) -> dict[str, Any]:
        return {
            "seconds": sum(self.step_times[start:]),
            "tokens": sum(self.step_tokens[start:]),
            "trained_tokens": sum(self.step_trained_tokens[start:]),
            "samples": sum(self.step_samples[start:]),
        }

    def log_scalars(self) -> dict[str, float]:
        """Rates over the steps measured since the previous log, as `throughput/<rate>`. Collective."""
        self._resolve()
        start, self._logged_upto = self._logged_upto, len(self.step_times)
        rates = self.rates(self._window(start))
        if len(self.step_times) > start:
            rates["step_time_s"] = statistics.median(self.step_times[start:])
        return {f"throughput/{name}": value for name, value in rates.items() if value is not None}

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._hook is not None:
            self._hook.remove()
        self._resolve()
        self.run_rates = self.rates(self._window(0))
        local = {
            "rank": args.process_index,
            "host": socket.gethostname(),
            "steps": self.steps,
            "slowest_steps": self.slowest_steps(),
        }
        self.ranks = gather_from_ranks(local)

    def slowest_steps(self, count: int = SLOWEST_STEPS_KEPT) -> list[list[float]]:
        """This rank's slowest measured steps, [[step, seconds]], slowest first: where a run's rate
        falls below its median step, which steps and which ranks took the time (the rate's window is
        the slowest rank's)."""
        slowest = sorted(zip(self.step_numbers, self.step_times, strict=True), key=lambda s: -s[1])
        return [[step, round(seconds, 4)] for step, seconds in slowest[:count]]

    def summary(self) -> dict[str, Any]:
        """Flat run-summary fields (see summary.FIELDS): rates over every measured step of the run."""
        self._resolve()
        fields: dict[str, Any] = {
            "throughput_warmup_steps": self.warmup_steps,
            "throughput_steps": len(self.step_times),
        }
        if self.step_times:
            fields.update(self.run_rates)
            fields["step_time_median_s"] = statistics.median(self.step_times)
            fields["step_time_p90_s"] = percentile(self.step_times, 90)
        return fields


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
