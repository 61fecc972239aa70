"""CPU allocations of a training from its start, as torch.profiler's memory events add them up: the
live bytes at each step's forward end and step end, and each step's peak. On CPU (gloo ranks) it
tells what a launch allocates beside what one process does, where no CUDA allocator counts.

finetune/run.py as it is, with a callback that records from the training's start to the end of its
third step (run.py flags after OUT; --max_steps 3 or more). Each rank prints one line,
`CENSUS RANK [[mark, live MiB, peak MiB since the last step end], ...]`, and writes OUT.rankN.json.
usage: accelerate launch --config_file PROFILE.yaml --num_processes N \\
           benchmarks/scripts/allocation_census.py OUT [run.py flags]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from run_with_callback import main_with
from transformers import TrainerCallback

MIB = 2**20
STEPS = 3
MARK = "CENSUS_"


def mark(name: str) -> None:
    with torch.profiler.record_function(MARK + name):
        pass


def tally(timeline: list[tuple[int, int | str]]) -> list[tuple[str, float, float]]:
    """(time, bytes) for an allocation (negative: a free) and (time, name) for a mark, in any order:
    at each mark, the live MiB then and the peak MiB since the last step's end."""
    live = peak = 0
    marks = []
    for _, value in sorted(timeline, key=lambda entry: (entry[0], isinstance(entry[1], str))):
        if isinstance(value, int):
            live += value
            peak = max(peak, live)
            continue
        marks.append((value, round(live / MIB, 2), round(peak / MIB, 2)))
        if value == "STEP_END":
            peak = live
    return marks


class AllocationCensus(TrainerCallback):
    def __init__(self, out: str):
        self.out = out

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        )
        self.profiler.__enter__()
        self.hook = model.register_forward_hook(lambda *unused: mark("FORWARD_END"))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        mark("STEP_END")
        if state.global_step != STEPS:
            return
        self.profiler.__exit__(None, None, None)
        self.hook.remove()
        timeline = []
        for event in self.profiler.profiler.kineto_results.events():
            if event.name() == "[memory]":
                timeline.append((event.start_ns(), event.nbytes()))
            elif event.name().startswith(MARK):
                timeline.append((event.start_ns(), event.name().removeprefix(MARK)))
        marks = tally(timeline)
        rank = int(os.environ.get("RANK", 0))
        print("CENSUS", rank, json.dumps(marks), flush=True)
        Path(f"{self.out}.rank{rank}.json").write_text(json.dumps(marks) + "\n")


if __name__ == "__main__":
    main_with(AllocationCensus(sys.argv[1]), sys.argv[2:])
