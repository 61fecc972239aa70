"""What is alive at a training step's memory peak, by the code that allocated it (issue 17 item 7),
or with SNAPSHOT_OF=evaluation at the final evaluation's.

finetune/run.py as it is, with torch's CUDA allocator history recorded over the first STEPS
optimizer steps. The trace is replayed (allocations against completed frees) to find the moment the
allocated memory peaked, and what was alive then is summed by the first frame outside torch's own
modules (a transformers or peft layer, finetune's loss, DeepSpeed's gather...). Writes OUT.json with
that table and OUT.pickle, the raw snapshot for https://pytorch.org/memory_viz.

Allocations alive before the recording began (the weights, the optimizer states) are one line,
"before the first step". The planner's question is what the rest is.
With several processes each rank writes OUT.rankN.json.
usage: accelerate launch --config_file PROFILE.yaml --num_processes N \\
           benchmarks/scripts/memory_snapshot.py OUT --max_steps 3 [run.py flags]
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections import defaultdict
from typing import Any

import torch
from transformers import TrainerCallback

GIB = 2**30
STEPS = 2
MAX_ENTRIES = 2_000_000
BEFORE = "before the first step"
LIBRARY_FRAMES = ("/torch/", "<frozen", "/contextlib.py", "/functools.py")


def allocating_site(frames: list[dict[str, Any]]) -> str:
    """The innermost frame that is not torch's own machinery: the layer or function that asked."""
    for frame in frames:
        if not any(part in frame["filename"] for part in LIBRARY_FRAMES):
            return f"{frame['filename'].split('site-packages/')[-1]}:{frame['line']} {frame['name']}"
    return f"{frames[0]['filename'].split('site-packages/')[-1]} {frames[0]['name']}" if frames else "unknown"


def peak_event(trace: list[dict[str, Any]], before_bytes: int) -> tuple[int, int]:
    """(peak allocated bytes, index of the event that reached it): allocations against completed frees."""
    sizes: dict[int, int] = {}
    current = peak = before_bytes
    peak_index = -1
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            sizes[event["addr"]] = event["size"]
            current += event["size"]
            if current > peak:
                peak, peak_index = current, index
        elif event["action"] == "free_completed" and event["addr"] in sizes:
            current -= sizes.pop(event["addr"])
    return peak, peak_index


def alive_at(trace: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The allocation events still alive after event `index` (replayed once: copying the live set at
    every new peak would be quadratic)."""
    live: dict[int, dict[str, Any]] = {}
    for event in trace[: index + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    return list(live.values())


def live_at_peak(alive: list[dict[str, Any]], before_bytes: int) -> dict[str, list[int]]:
    """{site: [bytes, allocations]} alive at the peak."""
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    sites[BEFORE] = [before_bytes, 0]
    for event in alive:
        site = sites[allocating_site(event.get("frames", []))]
        site[0] += event["size"]
        site[1] += 1
    return dict(sites)


def short_stack(frames: list[dict[str, Any]], depth: int = 12) -> str:
    """The innermost frames of an allocation, each file:line name, torch's own included: which op and
    which layer asked (a site alone was not enough: the first non-torch frame of every forward
    allocation of a LoRA step was the Trainer's training_step)."""
    names = [f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in frames[:depth]]
    return " <- ".join(names) or "unknown"


def largest_stacks(alive: list[dict[str, Any]], rows: int = 25) -> list[dict[str, Any]]:
    """What was alive at the peak, grouped by allocation stack and size: each group's bytes and count."""
    groups: dict[tuple[str, int], int] = defaultdict(int)
    for event in alive:
        groups[(short_stack(event.get("frames", [])), event["size"])] += 1
    ordered = sorted(groups.items(), key=lambda item: item[0][1] * item[1], reverse=True)[:rows]
    return [
        {"gib": round(size * count / GIB, 3), "allocations": count, "bytes_each": size, "stack": stack}
        for (stack, size), count in ordered
    ]


def table(peak: int, sites: dict[str, list[int]], rows: int = 30) -> list[dict[str, Any]]:
    ordered = sorted(sites.items(), key=lambda item: item[1][0], reverse=True)[:rows]
    return [
        {"site": site, "gib": round(size / GIB, 3), "allocations": count, "share": round(size / peak, 3)}
        for site, (size, count) in ordered
    ]


class SnapshotSteps(TrainerCallback):
    """Recorded from the training's start to the end of step STEPS; with `evaluation`, from the end of
    training to the end of the final evaluation instead (the planner's evaluation phase: the weights
    and optimizer states are then "before")."""

    def __init__(self, out: str, evaluation: bool = False) -> None:
        self.out, self.before, self.evaluation, self.recording = out, 0, evaluation, False

    def start(self) -> None:
        self.before, self.recording = torch.cuda.memory_allocated(), True
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.evaluation:
            self.start()

    def on_train_end(self, args, state, control, **kwargs):
        if self.evaluation:
            self.start()

    def on_step_end(self, args, state, control, **kwargs):
        if not self.evaluation and state.global_step == STEPS:
            self.write(args)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.evaluation and self.recording:  # the final evaluation, after training
            self.write(args)

    def write(self, args) -> None:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        self.recording = False
        trace = snapshot["device_traces"][torch.cuda.current_device()]
        peak, peak_index = peak_event(trace, self.before)
        alive = alive_at(trace, peak_index)
        result = {
            "argv": sys.argv[1:],
            "phase": "evaluation" if self.evaluation else f"steps 1-{STEPS}",
            "peak_gib": round(peak / GIB, 3),
            "max_memory_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
            "live_at_peak": table(peak, live_at_peak(alive, self.before)),
            "largest_stacks": largest_stacks(alive),
        }
        # every rank's own table (a sharded step's ranks differ: rank 0 alone does not explain it),
        # rank 0's raw snapshot
        rank = f".rank{args.process_index}" if args.world_size > 1 else ""
        measured = result["max_memory_allocated_gib"]
        print(f"SNAPSHOT{rank} peak {result['peak_gib']} GiB (max_memory_allocated {measured})")
        with open(f"{self.out}{rank}.json", "w") as file:
            json.dump(result, file, indent=1)
        if args.process_index == 0:
            with open(f"{self.out}.pickle", "wb") as file:
                pickle.dump(snapshot, file)


if __name__ == "__main__":
    from run_with_callback import main_with

    out = sys.argv.pop(1)
    main_with(SnapshotSteps(out, evaluation=os.environ.get("SNAPSHOT_OF") == "evaluation"), sys.argv[1:])
