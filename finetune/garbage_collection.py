"""Python's garbage collector during training: its pauses measured on every rank, and held off the
step with `--gc_interval N`.

Why it matters on several GPUs: a full collection walks every live Python object, and a compiled
model's process holds millions of them, so one rank can pause for a long time in the middle of a
step while the others wait for it at the next collective: every rank's step pays for one rank's
pause, at a moment no rank chose. torchtitan (`gc_freq`) and OLMo-core's GarbageCollectorCallback
switch automatic collection off and collect the young generations every N steps on every rank at
once instead; `--gc_interval` does the same, by default (0 leaves collection automatic). The pauses
are measured through `gc.callbacks` either way, so a run's summary says what its collections cost.
Like torchtitan, nothing collects the oldest generation until training ends: cyclic garbage that
outlives two young collections waits until then. Unlike torchtitan, the young generations are also
collected at the end of the first step: compiling the model there leaves millions of objects, and
with automatic collection off the first interval's collection walked them all, seconds inside a
measured step (docs/speed.md); after the first step, a step nobody times, it costs the same once.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from finetune.collectives import gather_from_ranks

# Every 10 steps: measured on several GPUs against automatic collection (docs/speed.md, "Python's
# garbage collector"): the young generations collect quickly, and at step ends no rank waits for another.
DEFAULT_GC_INTERVAL = 10
FULL_GENERATION = 2
# What `--gc_interval` collects at its steps, as torchtitan does: the young generations, where most
# garbage is; the full collection that can take seconds runs once, before training, and at the end.
YOUNG_GENERATIONS = 1


class GarbageCollectionCallback(TrainerCallback):
    """Times every collection between the start and the end of training (each rank its own), and
    with an interval collects on the step boundary instead of wherever the allocator trips it."""

    def __init__(self, interval: int = 0, clock: Callable[[], float] = time.perf_counter):
        self.interval = interval
        self.clock = clock
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self.ranks: list[dict[str, Any]] = []
        self._started: float | None = None
        self._was_enabled = True
        self._first_step_swept = False

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self.clock()
        elif self._started is not None:
            self.pauses.append((info["generation"], self.clock() - self._started))
            self._started = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.interval:
            gc.collect()  # the start-up's garbage, before the first step and outside the measure
            self._was_enabled = gc.isenabled()
            gc.disable()
        gc.callbacks.append(self._observe)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.interval and (not self._first_step_swept or state.global_step % self.interval == 0):
            self._first_step_swept = True
            gc.collect(YOUNG_GENERATIONS)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.stop()
        self.ranks = gather_from_ranks(self.local())

    def stop(self) -> None:
        """Collection as it was before training, measured no more; also where training raised and
        never reached its end. Idempotent."""
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)
            if self.interval and self._was_enabled:
                gc.enable()

    def local(self) -> dict[str, Any]:
        """This rank's collections during training: count, total and longest pause, full ones apart."""
        seconds = [pause for _, pause in self.pauses]
        return {
            "gc_collections": len(self.pauses),
            "gc_full_collections": sum(1 for generation, _ in self.pauses if generation == FULL_GENERATION),
            "gc_seconds": sum(seconds),
            "gc_longest_s": max(seconds, default=0.0),
        }

    def summary(self) -> dict[str, Any]:
        """Flat run-summary fields (see summary.FIELDS); empty before training ended."""
        if not self.ranks:
            return {}
        return {
            "gc_interval": self.interval,
            "gc_seconds_max": max(rank["gc_seconds"] for rank in self.ranks),
            "gc_longest_pause_s": max(rank["gc_longest_s"] for rank in self.ranks),
            "gc_full_collections_max": max(rank["gc_full_collections"] for rank in self.ranks),
        }
