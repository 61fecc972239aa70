"""Who starts CUDA while run.py's imports load, and are the allocator's segments expandable after?

Before it, finetune set the allocator's expandable segments at the top of run.py's `main`, after its
imports; CUDA reads that setting once, when it starts. This prints the stack of whatever starts CUDA
during `import finetune.run` (none: the setting in `main` was in time), then allocates and prints
whether the caching allocator's segments are expandable and which allocator variable is set.
usage (GPU, project root, after `source .device/setup.sh`):
    python benchmarks/h200-2026-12-02b/cuda_start_probe.py
"""

import os
import traceback

import torch

starting = torch.cuda._lazy_init


def traced_lazy_init():
    if not torch.cuda.is_initialized():
        print("PROBE CUDA started during the imports by:", flush=True)
        traceback.print_stack(limit=25)
    starting()


torch.cuda._lazy_init = traced_lazy_init
import finetune.run  # noqa: E402, F401

print("PROBE CUDA started by the imports:", torch.cuda.is_initialized(), flush=True)
torch.empty(2**28, device="cuda")
segments = torch.cuda.memory._snapshot()["segments"]
print(
    "PROBE is_expandable:", sorted({str(segment.get("is_expandable")) for segment in segments}),
    {name: os.environ.get(name) for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")},
    flush=True,
)  # fmt: skip
