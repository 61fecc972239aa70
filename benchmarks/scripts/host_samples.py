"""Where each rank's host time goes in the training loop, from py-spy's samples of an untraced run.

torch.profiler's own host cost doubled the several-GPU FSDP2 step it traced (90 -> 200 ms), hiding
what finetune's host does beside a hand-written torch loop's; py-spy samples the processes from
outside, at a rate that leaves the step as it was. floor.sh records a case under py-spy when its case
string starts with `SPY=1+` (`py-spy record --subprocesses --threads --format raw`: one line per
distinct stack, `process ...;thread ...;frame;...;frame COUNT`) and runs this on the result.

usage: python benchmarks/scripts/host_samples.py STACKS RATE CASE_DIR [FUNCTION,...]
(writes CASE_DIR/host_samples.json; the loop's steps, to give host milliseconds a step, are read from
the case's own result: run_summary.json's steps, or bare.json's timed and warm-up steps; py-spy's own
count of its samples and read errors from the case's log; STACKS may be gzipped; each FUNCTION
named, as the end of its frame's name, adds its host ms a step to `inside`)
       python benchmarks/scripts/host_samples.py --window SECONDS STACKS RATE OUT_JSON
(a window of SECONDS that py-spy sampled after attaching to a running run, floor.sh's
`SPY_NATIVE=1+` cases: its steps are not counted, so each thread's samples are given as a share of
the window's ticks, `share_of_window`, not as ms a step)

Per rank (each process with samples inside the training loop: not the launcher, the data loader's
workers or inductor's compile workers): the samples inside the training loop (the Trainer's epoch
loop, `_run_epoch`, bare_loop.py's `step`: not what `_inner_training_loop` does once before it and
after it, where accelerate builds DeepSpeed's engine and callbacks start, a run's once-only host
work that divided by the steps would read as the step's), those compiling (dynamo's and
inductor's compilation, CUDA graphs' recording: `COMPILING`) set apart; the loop's samples
inclusively by what they were inside (FSDP2's hooks, the compiled regions, the optimizer, ...), the
functions with the most self time and those the most samples were inside.

On a GPU the backward does not run on the loop's thread: autograd hands it to its own worker thread
(started by torch's C++, so its stacks have no Python root), where the compiled blocks' backward
launches and FSDP2's and DeepSpeed's gradient hooks run while the loop's thread waits, unsampled.
Its samples are counted apart, as `backward_thread`, the same way.

With `py-spy record --native` the stacks hold C++ frames too (`name (library.so)`): autograd's worker
is then the thread inside `torch::autograd::Engine::thread_main`, and each thread's samples in which
no Python frame ran (`share_without_python_frame`) are what sampling without --native never sees.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import Counter
from pathlib import Path

LOOP_FRAMES = re.compile(r"^(\S+\.)?_run_epoch \(transformers/trainer\.py|^main\.<locals>\.step \(")
# compilation alone: dynamo's tracing (the backend's compile runs beneath it), the backward's lazy
# compile, inductor's first-call tuning and CUDA graphs' first runs (eager, then recorded); inductor's
# runtime under torch/_inductor (the graph's input alignment, its kernels' launchers, a recorded
# graph's replay) runs every step and is the step's
COMPILING = re.compile(
    r"torch/_dynamo/convert_frame\.py|torch/_inductor/(async_compile|codecache)\.py"
    r"|^(?!cudagraphify\.)\S+ \(torch/_inductor/compile_fx\.py"
    r"|CachingAutotuner\.(precompile|benchmark_all_configs|autotune_to_one_config|coordinate_descent)"
    r"|CUDAGraphTreeManager\.(add_function|record_function|run_eager) "
)
# inclusive: a sample counts in every category one of its frames belongs to
CATEGORIES = {
    "FSDP2 hooks and collectives": r"torch/distributed/fsdp/_fully_shard/",
    "DDP": r"torch/nn/parallel/distributed\.py",
    "DeepSpeed": r"deepspeed/",
    "compiled regions (guards, wrappers, launches)": r"torch/_dynamo/eval_frame\.py|_aot_autograd/",
    "autograd (backward)": r"torch/autograd/",
    "optimizer step": r"torch/optim/",
    "gradient clipping": r"clip_grad",
    "loss": r"finetune/losses\.py|transformers/loss/",
    # accelerate's operations.py also holds ConvertOutputsToFp32, which wraps the whole forward
    "batches (data loader, copies)": r"torch/utils/data/|accelerate/data_loader\.py"
    r"|^send_to_device \(accelerate/utils/operations\.py",
    "callbacks": r"transformers/trainer_callback\.py",
    "garbage collection": r"finetune/garbage_collection\.py",
    "the CUDA driver (launches, synchronizes; --native only)": r"\(libcuda\.so",
}
PROCESS = re.compile(r'process (\d+):"[^"]*";')
THREAD = re.compile(r"^(thread \(\w+\))")  # py-spy writes `thread (TID): NAME`; the name is dropped
PYTHON_ROOT = re.compile(r"^(<module>|Thread\._bootstrap) ")  # the main thread's, and threading's
SAMPLE = re.compile(r"^(.*) (\d+)$")
PYTHON_FRAME = re.compile(r"\(\S+\.py:\d+\)$")
NATIVE_FRAME = re.compile(r"\(\S*\.so[.\d]*\)$")  # --native's C++ frames: `name (library.so)`
AUTOGRAD_WORKER = re.compile(r"^torch::autograd::Engine::thread_main ")


def rank_samples(lines: list[str]) -> dict[str, Counter[tuple[str, ...]]]:
    """Each process's stacks (from its thread frame down) and their sample counts, by process id, for
    the processes that ran the training loop. Lines that are not samples (pieces of a command line
    that held a newline) are skipped."""
    ranks: dict[str, Counter[tuple[str, ...]]] = {}
    for line in lines:
        sample = SAMPLE.match(line)
        if not line.startswith("process ") or not sample:
            continue
        stack, count = sample.group(1) + ";", int(sample.group(2))
        processes = PROCESS.findall(stack)
        if not processes:
            continue
        pid = processes[-1]
        frames = PROCESS.sub("", stack).rstrip(";").split(";")
        thread = THREAD.match(frames[0])
        frames = [thread.group(1), *frames[1:]] if thread else ["thread (?)", *frames]
        ranks.setdefault(pid, Counter())[tuple(frames)] += count
    return {pid: stacks for pid, stacks in ranks.items() if any(in_loop(frames) for frames in stacks)}


def in_loop(frames: tuple[str, ...]) -> bool:
    return any(LOOP_FRAMES.match(frame) for frame in frames)


def on_backward_thread(frames: tuple[str, ...]) -> bool:
    """Autograd's worker: by its C++ frame where py-spy sampled native frames (every thread then has
    a native root, Python's own threads too), else by its stack having no Python root."""
    if any(NATIVE_FRAME.search(frame) for frame in frames):
        return any(AUTOGRAD_WORKER.match(frame) for frame in frames)
    return len(frames) > 1 and not PYTHON_ROOT.match(frames[1])


def frame_name(frame: str) -> str:
    """`function (path:line)` without the line: one entry per function."""
    return re.sub(r":\d+\)$", ")", frame)


def summarize(
    stacks: Counter[tuple[str, ...]], rate: float, steps: int, functions: tuple[str, ...] = ()
) -> dict:
    loop = Counter({frames: n for frames, n in stacks.items() if in_loop(frames)})
    loop_threads = {frames[0] for frames in loop}
    backward = Counter(
        {
            frames: n
            for frames, n in stacks.items()
            if frames[0] not in loop_threads and on_backward_thread(frames)
        }
    )
    compiling = Counter(
        {frames: n for frames, n in (loop + backward).items() if any(COMPILING.search(f) for f in frames)}
    )
    steady, backward_steady = loop - compiling, backward - compiling
    return {
        "loop_samples": sum(steady.values()),
        "compiling_samples": sum(compiling.values()),
        **shares(steady, rate, steps, functions),
        "backward_thread": {
            "samples": sum(backward_steady.values()),
            **shares(backward_steady, rate, steps, functions),
        },
    }


def shares(
    samples: Counter[tuple[str, ...]], rate: float, steps: int, functions: tuple[str, ...] = ()
) -> dict:
    """One thread's host milliseconds a step, and what they were in."""
    total = sum(samples.values())

    def ms(n: int) -> float | None:
        return round(1e3 * n / rate / steps, 2) if steps else None

    categories = {
        name: sum(n for frames, n in samples.items() if any(re.search(pattern, f) for f in frames))
        for name, pattern in CATEGORIES.items()
    }
    self_time, inclusive = Counter(), Counter()
    for frames, n in samples.items():
        self_time[frame_name(frames[-1])] += n
        for name in {frame_name(frame) for frame in frames[1:]}:  # a recursive function counts once
            inclusive[name] += n
    inside = {
        function: ms(sum(n for frames, n in samples.items() if any(named(f, function) for f in frames)))
        for function in functions
    }
    without_python = sum(
        n for frames, n in samples.items() if not any(PYTHON_FRAME.search(f) for f in frames)
    )
    native = any(NATIVE_FRAME.search(f) for frames in samples for f in frames)
    return {
        "host_ms_per_step": ms(total),
        **({"inside": inside} if functions else {}),
        **({"share_without_python_frame": round(without_python / max(total, 1), 3)} if native else {}),
        "share_by_category": {name: round(n / max(total, 1), 3) for name, n in categories.items() if n},
        "top_self": [[name, round(n / total, 3)] for name, n in self_time.most_common(15)],
        # what the thread's time was inside, below the frames every sample is inside (the loop's own)
        "top_inclusive": [
            [name, round(n / total, 3)]
            for name, n in sorted(inclusive.items(), key=lambda item: (-item[1], item[0]))
            if n < total
        ][:25],
    }


def named(frame: str, function: str) -> bool:
    """A frame `Class.method (path:line)` is named by `method`, `Class.method` or any longer end of it."""
    name = frame.split(" (")[0]
    return name == function or name.endswith("." + function)


def loop_steps(case: Path) -> int:
    """The steps the sampled loop ran: finetune's all, bare_loop.py's warm-up steps as well."""
    if (case / "run_summary.json").exists():
        return json.loads((case / "run_summary.json").read_text())["steps"]
    bare = json.loads((case / "bare.json").read_text())
    return bare["steps"] + bare["warmup"]


PY_SPY_TOTALS = re.compile(r"py-spy> Wrote .* Samples: (\d+) Errors: (\d+)")
PY_SPY_BEHIND = re.compile(r"py-spy> ([\d.]+)s behind in sampling")


def sampler_report(case: Path) -> dict:
    """What py-spy said of its own sampling in the case's log: the samples it took, those it lost to
    read errors (`--nonblocking` reads a process while it runs) and the most it fell behind. Lost
    samples make every host time here a lower bound, so tables show them beside it; {} without a log."""
    log = case / "log"
    if not log.exists():
        return {}
    text = log.read_text(errors="replace")
    totals = PY_SPY_TOTALS.findall(text)
    behind = [float(seconds) for seconds in PY_SPY_BEHIND.findall(text)]
    if not totals:
        return {}
    samples, errors = (int(number) for number in totals[-1])
    return {"samples": samples, "errors": errors, "most_behind_s": max(behind, default=0.0)}


def read_stacks(stacks: Path) -> list[str]:
    """py-spy's raw lines, from a plain or gzipped file."""
    opener = gzip.open if stacks.suffix == ".gz" else open
    with opener(stacks, "rt", errors="replace") as text:
        return text.read().splitlines()


def window(argv: list[str]) -> int:
    """`--window SECONDS STACKS RATE OUT_JSON`: each thread's samples as a share of the window's ticks."""
    seconds, stacks, rate, out = float(argv[0]), Path(argv[1]), float(argv[2]), Path(argv[3])
    ticks = seconds * rate
    ranks = rank_samples(read_stacks(stacks))
    result = {"rate_hz": rate, "window_s": seconds, "ranks": {}}
    for pid, samples in sorted(ranks.items()):
        rank = summarize(samples, rate, steps=0)
        for thread in (rank, rank["backward_thread"]):
            del thread["host_ms_per_step"]  # no steps counted in a window
        rank["share_of_window"] = round(rank["loop_samples"] / ticks, 3)
        rank["backward_thread"]["share_of_window"] = round(rank["backward_thread"]["samples"] / ticks, 3)
        result["ranks"][pid] = rank
        print(
            f"process {pid}: the loop's thread ran in {rank['share_of_window']:.0%} of the window's ticks, "
            f"autograd's backward thread in {rank['backward_thread']['share_of_window']:.0%}"
        )
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "--window":
        return window(argv[1:])
    if len(argv) not in (3, 4):
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    stacks, rate, case = Path(argv[0]), float(argv[1]), Path(argv[2])
    functions = tuple(argv[3].split(",")) if len(argv) == 4 else ()
    steps, out = loop_steps(case), case / "host_samples.json"
    ranks = rank_samples(read_stacks(stacks))
    result = {
        "rate_hz": rate,
        "steps": steps,
        "sampler": sampler_report(case),
        "ranks": {pid: summarize(samples, rate, steps, functions) for pid, samples in sorted(ranks.items())},
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    for pid, rank in result["ranks"].items():
        backward = rank["backward_thread"]
        print(
            f"process {pid}: {rank['host_ms_per_step']} host ms a step in the loop ({rank['loop_samples']} "
            f"samples), {backward['host_ms_per_step']} on autograd's backward thread ({backward['samples']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
