"""Does run.py's allocator default take effect before CUDA starts? finetune/run.py with one more
callback, which prints after the first step whether the caching allocator's segments are expandable
and which of the variables run.py sets are set. usage (GPU, project root): python
benchmarks/h200-2026-11-29c/allocator_probe.py RUN_FLAGS..."""

import os
import sys

sys.path.insert(0, "benchmarks/scripts")
import torch
from run_with_callback import main_with
from transformers import TrainerCallback

VARIABLES = (
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
)


class Probe(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            segments = torch.cuda.memory._snapshot()["segments"]
            expandable = sorted({str(segment.get("is_expandable")) for segment in segments})
            names = {name: os.environ.get(name) for name in VARIABLES}
            print("PROBE", names, "is_expandable", expandable, len(segments), flush=True)


main_with(Probe(), sys.argv[1:])
