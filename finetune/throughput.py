"""How fast a run trains: tokens, samples and step times counted per step on each rank, and the rates
(tokens/s, samples/s, MFU) over the steady steps (the console lines that show them are
finetune/console.py's).

`ThroughputCallback.log_scalars()` (every logging step) and its `on_train_end` gather across ranks,
so they are collective: the Trainer calls both on every rank at the same point (`FinetuneTrainer.log`
only asks for scalars on the training-loss log, which every rank reaches after the loss all-gather).
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from finetune.collectives import gather_from_ranks
from finetune.data_formats import IGNORE_INDEX
from finetune.flops import PeakFlops, mfu
from finetune.layout import ParallelLayout


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
