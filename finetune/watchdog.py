"""A run that stops making progress ends with one line naming the rank that stopped and where, its
stacks on disk, instead of hanging until the job's time limit.

Each rank watches its own optimizer steps from a thread. When no step ends within the limit (by
default 20 times the median step, at least 10 minutes, armed after the first step so that start-up
and compilation never count), every rank writes its Python stacks (faulthandler) and where its main
thread is into `output_dir/hang-step<N>/`; under NCCL it also asks torch for its flight recorder's
trace. Rank 0 reads the others' files: a rank whose main thread is not inside a collective is one
that did not arrive. A rank 0 that writes nothing (stopped, or stuck in C with its threads) is
reported by the lowest other rank instead, naming rank 0 as the one without a stack. The run then
ends: exit 75 when a checkpoint exists (a SLURM requeue resumes it), else 1, its summary saying
why. No library does this for a Trainer run; torch's own NCCL watchdog only fires at the
collective timeout, with nothing about the ranks' Python.
"""

from __future__ import annotations

import faulthandler
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from finetune.checkpoint import checkpoints_newest_first
from finetune.collectives import in_a_helper
from finetune.errors import RESUMABLE_EXIT_CODE
from finetune.run_folder import hang_dir

STEP_TIMES_FACTOR = 20.0
FLOOR_S = 600.0
POLL_S = 1.0
GATHER_S = 15.0  # how long the reporting rank waits for the other ranks' files
REPORTED = "reported.txt"  # written by the rank that reported the hang (rank 0, else the lowest other)
# Where a rank that arrived waits for the others: in a collective, or in backward, where DDP's and
# FSDP's gradient collectives run inside the autograd engine.
COLLECTIVE_FILES = ("torch/distributed", "deepspeed/comm", "accelerate/utils/operations", "torch/autograd/")


def innermost_frames(thread_id: int) -> list[str]:
    """The thread's stack as `file:line in function`, innermost last."""
    frame = sys._current_frames().get(thread_id)
    frames = []
    while frame is not None:
        frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return frames[::-1]


def in_a_collective(frames: list[str]) -> bool:
    return any(in_a_helper(frame) or any(marker in frame for marker in COLLECTIVE_FILES) for frame in frames)


class Watchdog(TrainerCallback):
    """`limit_s`: seconds without an optimizer step (None: automatic, see the module; 0: off).
    `on_hang(message, folder)` runs on the reporting rank before the process ends (the run summary):
    rank 0, or, when rank 0 has not reported within the gathering time, the lowest other rank."""

    def __init__(
        self,
        limit_s: float | None,
        output_dir: str,
        rank: int,
        world_size: int,
        on_hang: Callable[[str, Path], None],
    ) -> None:
        self.limit_s = limit_s
        self.output_dir = Path(output_dir)
        self.rank, self.world_size = rank, world_size
        self.on_hang = on_hang
        self.step_times: list[float] = []
        self.last_end: float | None = None
        self.last_step = 0
        self.stopped = threading.Event()

    def limit(self) -> float:
        if self.limit_s is not None:
            return self.limit_s
        median = statistics.median(self.step_times) if self.step_times else 0.0
        return max(STEP_TIMES_FACTOR * median, FLOOR_S)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.limit_s == 0:
            return
        self.main_thread = threading.main_thread().ident
        threading.Thread(target=self.watch, name="finetune-watchdog", daemon=True).start()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        now = time.monotonic()
        if self.last_end is not None:
            self.step_times.append(now - self.last_end)
        self.last_end, self.last_step = now, state.global_step

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """An evaluation between steps is progress too: each of its batches restarts the clock."""
        if self.last_end is not None:
            self.last_end = time.monotonic()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Not watching while a checkpoint is written (a large sharded save may outlast the limit)."""
        last_end, self.last_end = self.last_end, None
        try:
            yield
        finally:
            self.last_end = None if last_end is None else time.monotonic()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.stop()  # evaluation and the final save are not steps

    def stop(self) -> None:
        """No more watching. Also where training ended by an exception, which skips on_train_end: an
        armed watchdog left in a process that goes on (a test, a notebook) fired there minutes later
        and ended that process."""
        self.stopped.set()

    def watch(self) -> None:
        while not self.stopped.wait(POLL_S):
            if self.last_end is not None and time.monotonic() - self.last_end > self.limit():
                self.fire(time.monotonic() - self.last_end)

    def fire(self, waited: float) -> None:
        step = self.last_step + 1
        folder = hang_dir(self.output_dir, step)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"rank{self.rank}.txt", "w") as stream:
            faulthandler.dump_traceback(stream, all_threads=True)
        frames = innermost_frames(self.main_thread)
        record = {"rank": self.rank, "last_step": self.last_step, "frames": frames,
                  "in_collective": in_a_collective(frames)}  # fmt: skip
        (folder / f"rank{self.rank}.json").write_text(json.dumps(record, indent=1) + "\n")
        dump_nccl_trace(folder, self.rank)
        code = RESUMABLE_EXIT_CODE if checkpoints_newest_first(self.output_dir) else 1
        if self.rank == 0:
            self.end_the_run(folder, step, waited, sys.stderr)
        else:
            # This rank's stacks are on disk: what its main thread prints from now on (a collective
            # failing as the reporting rank exits) would only bury the report's one line.
            stderr = os.fdopen(os.dup(2), "w")
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), 2)
            reported = waited_for(folder / REPORTED, GATHER_S + 5)  # rank 0 reads this rank's files
            if not reported and self.rank == lowest_other_rank(folder):  # rank 0 frozen or gone
                # every rank had rank 0's time to write its files: read what is there, no second wait
                self.end_the_run(folder, step, waited, stderr, gather_s=0.0)
        os._exit(code)

    def end_the_run(
        self, folder: Path, step: int, waited: float, stderr: Any, gather_s: float = GATHER_S
    ) -> None:
        """The one line, the summary (`on_hang`), and the mark that the run has been reported."""
        message = self.report(folder, step, waited, gather_s)
        print(f"finetune: {message}", file=stderr, flush=True)
        self.on_hang(message, folder)
        (folder / REPORTED).write_text(message + "\n")

    def report(self, folder: Path, step: int, waited: float, gather_s: float = GATHER_S) -> str:
        """The one line, from the ranks' files that are there within `gather_s` (read at least once)."""
        deadline = time.monotonic() + gather_s
        records: dict[int, dict[str, Any]] = {}
        while True:
            for path in folder.glob("rank*.json"):
                try:
                    records[int(path.stem[4:])] = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
            if len(records) >= self.world_size or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        absent = [rank for rank in range(self.world_size) if rank not in records]
        stuck = {
            rank: record["frames"][-1] for rank, record in records.items() if not record["in_collective"]
        }
        who = "; ".join(f"rank {rank} at {where}" for rank, where in sorted(stuck.items()))
        if not who:
            who = "every rank that answered waits in a collective"
        if absent:
            who += f"; no stack from rank(s) {', '.join(map(str, absent))} (another machine, or stuck in C)"
        return (
            f"no optimizer step ended for {waited:.0f} s (limit {self.limit():.0f} s) at step {step}: "
            f"{who}; stacks in {folder}"
        )


def waited_for(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.2)
    return path.exists()


def lowest_other_rank(folder: Path) -> int | None:
    """The lowest rank but 0 that wrote its stacks: it reports when rank 0 does not (a rank 0
    stopped by SIGSTOP or stuck in C writes nothing, its watchdog thread frozen with it)."""
    ranks = [int(path.stem[4:]) for path in folder.glob("rank*.json") if path.stem[4:].isdigit()]
    others = [rank for rank in ranks if rank != 0]
    return min(others) if others else None


def dump_nccl_trace(folder: Path, rank: int) -> None:
    """NCCL's flight recorder (what each rank's collectives were), where torch keeps one: best effort,
    through torch's own dump function (private; absent without NCCL or with TORCH_FR_BUFFER_SIZE
    unset, which run.py sets on GPUs)."""
    try:
        import torch.distributed as dist

        if not (dist.is_initialized() and dist.get_backend() == "nccl"):
            return
        from torch._C._distributed_c10d import _dump_nccl_trace

        (folder / f"nccl-trace-rank{rank}.pkl").write_bytes(_dump_nccl_trace())
    except Exception:  # a missing trace must not keep the stacks from being written
        return
