"""Numbers read from every rank's torch.profiler trace of the same steps (rank_traces.py wrote them).

Per rank: the GPU's time in compute kernels, in NCCL kernels (and how much of that no compute
overlaps), idle; the host's busy time per thread and per kind of work (FSDP2's hooks, compiled
regions, the optimizer step); each host synchronization call with the time it blocked.

Across ranks, collective by collective: the ranks of one host share a clock and end a collective
together, so NCCL kernels of the same type are paired by their end times (a pairing that does not
depend on which collective each rank's window began with, and checks the clocks at the same time).
For each collective: when each rank's kernel started, which rank arrived last, how long the others
waited for it, how long the transfer took once all had arrived, and why the last one was late: its
kernel started right after the host launched it (host-late: the host issued it late), or long after
(queued: the GPU was still busy with earlier work on that stream). The host annotation around the
late rank's launch says what the host was doing.

usage: python benchmarks/scripts/trace_analysis.py TRACE_DIR STEPS OUT.json
"""

from __future__ import annotations

import collections
import json
import re
import statistics
import sys
from pathlib import Path

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
END_TOLERANCE_US = 200.0  # ranks' kernels of one collective end within this of each other
HOST_LATE_US = 50.0  # a kernel starting within this of its launch waited for the host
HOST_KINDS = {
    "fsdp_hooks": re.compile(r"^FSDP::"),
    "compiled_regions": re.compile(r"^(Torch-Compiled Region|CompiledFunction)"),
    "optimizer_step": re.compile(r"^Optimizer\.step"),
    "autograd_backward": re.compile(r"^autograd::engine::evaluate_function"),
}


def union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e3


def intersection_ms(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return union_ms(a) + union_ms(b) - union_ms(a + b)


def collective_type(name: str) -> str | None:
    found = re.search(r"(AllGather|ReduceScatter|AllReduce|Broadcast|Reduce|SendRecv|AllToAll)", name)
    return found.group(1) if found and "nccl" in name.lower() else None


def strip_numbers(name: str) -> str:
    """`FSDP::pre_forward (transformer.h.7)` and `... h.8` are one kind of work."""
    return re.sub(r"\d+", "N", name)[:90]


def read_rank(path: Path, steps: int) -> dict:
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    host = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launches = {e["args"].get("correlation"): e for e in runtime if e["name"] in LAUNCH_CALLS}
    nccl = [e for e in kernels if collective_type(e["name"])]
    compute = [e for e in kernels if not collective_type(e["name"])]
    span = lambda es: [(e["ts"], e["ts"] + e["dur"]) for e in es]  # noqa: E731
    timed = kernels or host  # a CPU run's trace has no kernels: its window is the host's
    gpu_start = min(e["ts"] for e in timed)
    gpu_end = max(e["ts"] + e["dur"] for e in timed)
    window_ms = (gpu_end - gpu_start) / 1e3
    per_step = lambda ms: round(ms / steps, 3)  # noqa: E731
    threads = collections.defaultdict(list)
    for e in host:
        threads[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    syncs = collections.defaultdict(lambda: [0, 0.0])
    for e in runtime:
        if e["name"] in SYNC_CALLS:
            syncs[e["name"]][0] += 1
            syncs[e["name"]][1] += e["dur"] / 1e3
    collectives = []
    for e in nccl:
        launch = launches.get(e["args"].get("correlation"))
        collectives.append(
            {
                "type": collective_type(e["name"]),
                "start": e["ts"],
                "end": e["ts"] + e["dur"],
                "launched": launch["ts"] + launch["dur"] if launch else None,
                "launch_tid": launch["tid"] if launch else None,
            }
        )
    annotations = [e for e in host if e.get("cat") == "user_annotation" or e["name"].startswith("FSDP")]
    python = [e for e in host if e.get("cat") == "python_function"]
    return {
        "summary": {
            "step_ms": per_step(window_ms),
            "gpu_compute_ms": per_step(union_ms(span(compute))),
            "gpu_nccl_ms": per_step(union_ms(span(nccl))),
            "gpu_nccl_not_overlapped_ms": per_step(
                union_ms(span(nccl)) - intersection_ms(span(nccl), span(compute))
            ),
            "gpu_idle_ms": per_step(window_ms - union_ms(span(kernels))),
            "host_busy_ms_by_thread": {
                str(tid): per_step(union_ms(spans)) for tid, spans in threads.items() if union_ms(spans) > 1
            },
            "host_ms_by_kind": {
                kind: per_step(union_ms(span([e for e in host if pattern.match(e["name"])])))
                for kind, pattern in HOST_KINDS.items()
            },
            "host_syncs_per_step": {
                name: {"calls": round(count / steps, 1), "blocked_ms": per_step(ms)}
                for name, (count, ms) in syncs.items()
            },
            "nccl_kernels_per_step": round(len(nccl) / steps, 1),
            "python_self_ms_top": {name: per_step(ms) for name, ms in self_times(python).most_common(15)},
            "python_self_ms_top_by_caller": {
                name: per_step(ms) for name, ms in self_times(python, callers=2).most_common(15)
            },
        },
        "collectives": collectives,
        "annotations": [(e["tid"], e["ts"], e["ts"] + e["dur"], e["name"]) for e in annotations],
    }


def self_times(events: list[dict], callers: int = 0) -> collections.Counter[str]:
    """Milliseconds each function spent in itself (its callees' time taken out), by function, or
    with `callers` levels of its callers: "function <- caller <- its caller" (a builtin such as
    Tensor.to is anonymous until its caller is named, and a helper such as a dtype cast until its
    own caller is).

    Traced with `with_stack`: the Python functions of one thread nest like a call stack.
    """
    totals: collections.Counter[str] = collections.Counter()
    by_thread = collections.defaultdict(list)
    for e in events:
        by_thread[e["tid"]].append(e)
    for thread in by_thread.values():
        stack: list[list] = []  # [end, name, key, time left to itself]
        for e in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1][0] <= e["ts"]:
                _, _, key, own = stack.pop()
                totals[key] += own / 1e3
            name = strip_numbers(e["name"])
            above = [frame[1] for frame in reversed(stack[-callers:])] if callers else []
            if callers and len(above) < callers:
                above.append("(thread)")
            key = " <- ".join([name, *above])
            if stack:
                stack[-1][3] -= e["dur"]
            stack.append([e["ts"] + e["dur"], name, key, e["dur"]])
        for _, _, key, own in stack:
            totals[key] += own / 1e3
    return totals


def enclosing_annotation(annotations: list, tid, at: float) -> str:
    """The innermost host annotation on that thread around a moment (what the host was doing)."""
    around = [a for a in annotations if a[0] == tid and a[1] <= at <= a[2]]
    return strip_numbers(min(around, key=lambda a: a[2] - a[1])[3]) if around else "(none)"


def pair_collectives(ranks: dict[int, dict]) -> list[dict[int, dict]]:
    """Each collective as {rank: its kernel}, paired with rank 0's kernels by end time."""
    reference, *others = sorted(ranks)
    by_type = {rank: collections.defaultdict(list) for rank in others}
    for rank in others:
        for kernel in ranks[rank]["collectives"]:
            by_type[rank][kernel["type"]].append(kernel)
    paired = []
    for kernel in ranks[reference]["collectives"]:
        match = {reference: kernel}
        for rank in others:
            candidates = by_type[rank][kernel["type"]]
            nearest = min(candidates, key=lambda c: abs(c["end"] - kernel["end"]), default=None)
            if nearest is None or abs(nearest["end"] - kernel["end"]) > END_TOLERANCE_US:
                break
            match[rank] = nearest
        else:
            paired.append(match)
    return paired


def analyse(folder: Path, steps: int) -> dict:
    ranks = {
        int(re.search(r"rank(\d+)", path.name).group(1)): read_rank(path, steps)
        for path in sorted(folder.glob("rank*.trace.json"))
    }
    result = {"steps": steps, "ranks": {rank: data["summary"] for rank, data in ranks.items()}}
    if len(ranks) < 2:
        return result
    paired = pair_collectives(ranks)
    last_counts: collections.Counter[int] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    doing: collections.Counter[str] = collections.Counter()
    by_type = collections.defaultdict(
        lambda: {"kernel_ms": [], "transfer_ms": [], "wait_ms": [], "spread_us": []}
    )
    for match in paired:
        last_rank = max(match, key=lambda rank: match[rank]["start"])
        last = match[last_rank]
        last_counts[last_rank] += 1
        if last["launched"] is not None:
            host_late = last["start"] - last["launched"] < HOST_LATE_US
            reasons["host-late" if host_late else "queued behind GPU work"] += 1
            doing[
                enclosing_annotation(ranks[last_rank]["annotations"], last["launch_tid"], last["launched"])
            ] += 1
        numbers = by_type[last["type"]]
        ends = [kernel["end"] for kernel in match.values()]
        numbers["kernel_ms"] += [(k["end"] - k["start"]) / 1e3 for k in match.values()]
        numbers["transfer_ms"].append((statistics.median(ends) - last["start"]) / 1e3)
        numbers["wait_ms"] += [(last["start"] - k["start"]) / 1e3 for k in match.values() if k is not last]
        numbers["spread_us"].append(max(ends) - min(ends))
    result["collectives"] = {
        "paired": len(paired),
        "unpaired_on_rank0": len(ranks[min(ranks)]["collectives"]) - len(paired),
        "last_to_arrive": {str(rank): count for rank, count in sorted(last_counts.items())},
        "why_last_was_late": dict(reasons),
        "host_doing_before_late_launch": dict(doing.most_common(8)),
        "by_type": {
            kind: {
                "per_step": round(len(numbers["transfer_ms"]) / steps, 1),
                "median_kernel_ms": round(statistics.median(numbers["kernel_ms"]), 3),
                "median_transfer_after_last_arrival_ms": round(statistics.median(numbers["transfer_ms"]), 3),
                "median_wait_for_last_ms": round(statistics.median(numbers["wait_ms"]), 3),
                "waited_ms_per_step_per_rank": round(sum(numbers["wait_ms"]) / steps / len(ranks), 2),
                "max_end_spread_us": round(max(numbers["spread_us"]), 1),
            }
            for kind, numbers in by_type.items()
        },
    }
    return result


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python benchmarks/scripts/trace_analysis.py TRACE_DIR STEPS OUT.json")
    numbers = analyse(Path(sys.argv[1]), int(sys.argv[2]))
    Path(sys.argv[3]).write_text(json.dumps(numbers, indent=1))
    print(json.dumps(numbers)[:3000])
