"""The reference figure beside `finetune doctor`'s bandwidth rows: a plain torch loop over NCCL
all-reduce and all-gather timed with CUDA events (as nccl-tests times them), at doctor's sizes.

usage: torchrun --nproc_per_node N benchmarks/scripts/collective_loop.py OUT.json
Bus bandwidth as nccl-tests reports it: all-reduce moves 2(n-1)/n of the buffer, all-gather (n-1)/n.
"""

import functools
import json
import os
import sys

import torch
import torch.distributed as dist

SIZES = (1 << 20, 64 << 20, 256 << 20)
WARMUP, REPEATS = 5, 50
ALL_GATHER = dist.all_gather_into_tensor


def timed(operation) -> float:
    """Mean seconds of one call, from CUDA events around REPEATS calls after WARMUP."""
    for _ in range(WARMUP):
        operation()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPEATS):
        operation()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / REPEATS


def main() -> None:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    rows = []
    for size in SIZES:
        buffer = torch.ones(size // 4, device="cuda")
        gathered = torch.empty(world * buffer.numel(), device="cuda")
        for name, operation, factor in (
            ("all-reduce", functools.partial(dist.all_reduce, buffer), 2 * (world - 1) / world),
            ("all-gather", functools.partial(ALL_GATHER, gathered, buffer), (world - 1) / world),
        ):
            seconds = timed(operation)
            rows.append({"operation": name, "bytes": size, "gpus": world, "seconds": seconds,
                         "busbw_gbps": size * factor / seconds / 1e9})  # fmt: skip
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as stream:
            json.dump(rows, stream, indent=1)
        for row in rows:
            print(
                f"{row['operation']} {row['bytes'] >> 20} MiB on {world} GPUs: {row['busbw_gbps']:.1f} GB/s"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
