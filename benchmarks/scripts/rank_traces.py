"""Every rank's view of a few steady training steps: finetune/run.py as it is, with torch.profiler on
every rank from the end of step FIRST to the end of step FIRST+STEPS (whole cycles: the next batch's
fetch, forward, backward, optimizer step, the step's checks), then one more cycle under torch's sync
debug mode.

Writes, per rank, DIR/rank<R>.trace.json (the Chrome trace; large: read by trace_analysis.py on the
machine, never kept in the tree) and DIR/rank<R>.syncs.json: each host synchronization of the audited
step (a `.item()`, a blocking copy, a stream synchronize) with the first frame outside torch that
asked for it. Ranks are profiled over the same steps, so their traces can be aligned collective by
collective (all ranks end a collective together; trace_analysis.py pairs them by that).

usage: accelerate launch --config_file PROFILE.yaml --num_processes N \\
           benchmarks/scripts/rank_traces.py DIR --max_steps 14 [run.py flags]
"""

import collections
import json
import os
import sys
import traceback
import warnings

import torch
from run_with_callback import main_with
from torch.profiler import ProfilerActivity, profile
from transformers import TrainerCallback

FIRST_STEP, STEPS = 8, 3
AUDITED_STEP = FIRST_STEP + STEPS
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
LIBRARY_MARKERS = (TORCH_DIR, "<frozen", "/warnings.py")
WITH_STACKS = os.environ.get("TRACE_STACKS") == "1"  # Python functions in the trace (slower steps)


def asking_frame(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame outside torch itself: the code that asked for the synchronization."""
    for frame in reversed(stack):
        if not any(marker in frame.filename for marker in LIBRARY_MARKERS):
            parts = frame.filename.split("-packages/")[-1]
            return f"{parts}:{frame.lineno} {frame.name}"
    return "torch"


class RankTraces(TrainerCallback):
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.profiler = None
        self.syncs: collections.Counter[str] = collections.Counter()
        self.saved_showwarning = None

    def _record_sync(self, message, category, filename, lineno, file=None, line=None):
        if "synchronizing" in str(message):
            self.syncs[asking_frame(traceback.extract_stack()[:-1])] += 1
        else:
            self.saved_showwarning(message, category, filename, lineno, file, line)

    def on_step_end(self, args, state, control, **kwargs):
        rank = args.process_index
        os.makedirs(self.folder, exist_ok=True)
        if state.global_step == FIRST_STEP:
            activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
            self.profiler = profile(activities=activities, with_stack=WITH_STACKS)
            self.profiler.__enter__()
        if state.global_step == FIRST_STEP + STEPS and self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler.export_chrome_trace(f"{self.folder}/rank{rank}.trace.json")
            self.profiler = None
        if state.global_step == AUDITED_STEP and torch.cuda.is_available():
            self.saved_showwarning = warnings.showwarning
            warnings.showwarning = self._record_sync
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        elif state.global_step == AUDITED_STEP + 1 and self.saved_showwarning is not None:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = self.saved_showwarning
            self.saved_showwarning = None
            audit = {
                "step": AUDITED_STEP + 1,
                "syncs": sum(self.syncs.values()),
                "by_source": dict(self.syncs),
            }
            with open(f"{self.folder}/rank{rank}.syncs.json", "w") as file:
                json.dump(audit, file, indent=1)
            if rank == 0:
                print(f"SYNCS in step {AUDITED_STEP + 1}: {audit['syncs']} {dict(self.syncs.most_common(8))}")


if __name__ == "__main__":
    folder = sys.argv.pop(1)
    main_with(RankTraces(folder), sys.argv[1:])
