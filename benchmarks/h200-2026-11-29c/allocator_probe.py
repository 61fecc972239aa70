"""Does run.py's allocator default take effect before CUDA starts? (a one-off device check)"""
import os
import sys

sys.path.insert(0, "benchmarks/scripts")
import torch
from transformers import TrainerCallback
from run_with_callback import main_with


class Probe(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            segments = torch.cuda.memory._snapshot()["segments"]
            names = {n: os.environ.get(n) for n in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
            print("PROBE", names, "is_expandable", sorted({str(s.get("is_expandable")) for s in segments}), len(segments), flush=True)


main_with(Probe(), sys.argv[1:])
