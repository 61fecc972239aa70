"""Where a training step's time goes under a profile (issue 6): finetune/run.py as it is, with
torch.profiler around three steady-state optimizer steps (steps 9-11).

Writes OUT.json with the GPU-busy share (the summed time of all GPU kernels over the profiled wall
time: far under 1 means the GPU waits for the host, on hooks, launches and Python, not on
arithmetic), the kernels with the most GPU time and the operators with the most host time.
The profiler's own overhead lengthens host-bound steps: compare shares, not step times, with the
unprofiled runs.
usage: accelerate launch --config_file PROFILE.yaml --num_processes 1 \\
           benchmarks/scripts/profile_steps.py OUT --max_steps 12 [run.py flags]
"""

import json
import sys
import time

import torch
from run_with_callback import main_with
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from transformers import TrainerCallback

FIRST_STEP, STEPS = 8, 3


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def top(events, key: str, count: int = 15) -> list[dict]:
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:count]
    return [{"name": e.key[:120], "calls": e.count, "ms": getattr(e, key) / 1e3} for e in rows]


class ProfileSteps(TrainerCallback):
    def __init__(self, out: str) -> None:
        self.out, self.profiler, self.start = out, None, 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == FIRST_STEP:
            synchronize()
            self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.profiler.__enter__()
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != FIRST_STEP + STEPS or self.profiler is None:
            return
        synchronize()
        wall_ms = (time.perf_counter() - self.start) * 1e3
        self.profiler.__exit__(None, None, None)
        events = self.profiler.key_averages()
        # kernels only: an operator's entry repeats its kernels' time
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        kernel_ms = sum(e.self_device_time_total for e in kernels) / 1e3
        result = {
            "argv": sys.argv[1:],
            "step_ms": wall_ms / STEPS,
            "gpu_kernel_ms_per_step": kernel_ms / STEPS,
            "gpu_busy": kernel_ms / wall_ms,
            "top_gpu": top(kernels, "self_device_time_total"),
            "top_host": top(events, "self_cpu_time_total"),
        }
        if args.process_index == 0:
            print(f"PROFILE step {result['step_ms']:.1f} ms, GPU busy {result['gpu_busy']:.2f}")
            with open(f"{self.out}.json", "w") as file:
                json.dump(result, file, indent=1)


if __name__ == "__main__":
    out = sys.argv.pop(1)
    main_with(ProfileSteps(out), sys.argv[1:])
