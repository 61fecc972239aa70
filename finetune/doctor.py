"""`finetune doctor`: the machine checked for a run before the run, by the ranks the run would start.

`finetune doctor --profile P --num_processes N [run flags]` launches this file exactly as `finetune run`
launches run.py (gloo on CPU, NCCL on GPUs, any number of machines through the same launcher). Each
rank checks what it can see; rank 0 gathers the rows and prints one table: each check, its measured
figure, what it should be and what to do when it fails. It exits 0 only if every check passes and
writes the table to `output_dir/doctor.json`. Collective bandwidth is reported as nccl-tests reports
it (bus bandwidth: all-reduce moves 2(n-1)/n of the buffer, all-gather (n-1)/n).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a file by accelerate launch: import the package, not its siblings
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import finetune  # noqa: F401, I001 (first: its import filters the libraries' known noise)
import psutil
import torch
import torch.distributed as dist

from finetune.resolved import ResolvedRun, resolve_run
from finetune.build_locks import (
    build_lock_problem,
    extensions_root,
    held_by_stopped_processes,
    stale_build_locks,
)
from finetune.errors import CHECK_FAILED_EXIT_CODE, FinetuneError, exit_on_user_error, first_line
from finetune.launched import Launch
from finetune.run_folder import DOCTOR_REPORT

# Bytes per collective. Bus bandwidth only shows at large buffers (nccl-tests sweeps up to GBs); GPUs
# get one large size, CPU ranks stay small so the check takes a second there.
COLLECTIVE_SIZES = {"cuda": (1 << 20, 64 << 20, 256 << 20), "cpu": (1 << 20, 16 << 20)}
COLLECTIVE_REPEATS = {"cuda": 20, "cpu": 5}
# The least all-reduce bus bandwidth at the largest size for each link, in GB/s: far below what such a
# link gives (NVLink: hundreds; PCIe 4/5 x16: about 20-50; a 100 Gb/s network: about 10), so that a
# check fails only for a link that is not what it claims (NVLink off, a GPU on a x1 slot, TCP over a
# management network) and never for an ordinary machine.
BANDWIDTH_FLOOR_GBPS = {"NVLink": 50.0, "PCIe": 3.0, "network": 1.0}
OP_BUILD_LIMIT_S = 600  # the longest a DeepSpeed op build may take before doctor calls it failed
GATHER_MARGIN_S = 600  # the other checks' time on top of the builds, for the collective timeout
NVME_PROBE_BYTES = {"cuda": 1 << 30, "cpu": 64 << 20}
NVME_FLOOR_GBPS = 0.5  # ZeRO-Infinity swaps every step: below this a disk makes the GPU wait
# torch renamed the tensor all-gather (and warns at every call of the old name): the new one where it exists
ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


RUN_CHECKED = "run checked"


@dataclass
class Check:
    name: str
    measured: str
    expected: str
    passed: bool
    advice: str = ""
    rank: int = 0


def names_check(model_args, data_args) -> list[Check]:
    """Model, tokenizer and dataset found offline, as the run will look for them, the data's format."""
    from finetune.data import load_raw
    from finetune.instruction import detect_format
    from finetune.models import resolve_model

    checks = []
    for what, name in (("model", model_args.model), ("tokenizer", model_args.tokenizer)):
        if name is None:
            continue
        try:
            found = resolve_model(name)
            checks.append(Check(f"{what} found", found, "a local folder or a Hub name", True))
        except FinetuneError as error:
            checks.append(Check(f"{what} found", "not found", name, False, first_line(error)))
    try:
        raw, source = load_raw(data_args)
        columns = next(iter(raw.values())).column_names
        data_format = detect_format(columns, data_args.text_column, data_args.data_format)
        checks.append(
            Check("dataset found", f"{source} ({data_format.description})", data_args.dataset, True)
        )
    except FinetuneError as error:
        checks.append(Check("dataset found", "not found", data_args.dataset, False, first_line(error)))
    return checks


def build_lock_check(launch: Launch) -> Check:
    expected = "none left by a dead or stopped process"
    stale = stale_build_locks(extensions_root(), launch.on_one_machine)
    if stale:
        return Check("op build locks", f"stale: {stale[0]}", expected, False, f"rm {stale[0]}")
    stopped = held_by_stopped_processes(extensions_root())
    if stopped:
        lock, pids = stopped
        listed = " ".join(map(str, pids))
        return Check("op build locks", f"held by stopped process(es) {listed}: {lock}", expected, False,
                     f"kill -CONT {listed} (or end them)")  # fmt: skip
    return Check("op build locks", "none stale", expected, True)


def disk_check(model_args, training_args) -> Check:
    """Free space in output_dir against the checkpoints the run keeps (save_total_limit, and the one
    being written before the oldest is rotated out)."""
    from finetune.disk_space import (
        CHECKPOINT_BYTES_PER_PARAMETER,
        checkpoints_at_once,
        existing_folder,
        free_bytes,
    )
    from finetune.model_shapes import shape_of

    existing = existing_folder(Path(training_args.output_dir))
    free = free_bytes(existing)
    if training_args.save_strategy == "no":
        return Check("disk", f"{free / 2**30:.1f} GiB free", "no checkpoints saved", True)
    shape, _ = shape_of(model_args.model, model_args.config_overrides)
    keep = checkpoints_at_once(training_args.save_total_limit)
    needed = keep * shape.parameters * CHECKPOINT_BYTES_PER_PARAMETER
    passed = free >= needed
    advice = "" if passed else "free space, lower --save_total_limit or choose another --output_dir"
    return Check(
        "disk",
        f"{free / 2**30:.1f} GiB free in {existing}",
        f">= {needed / 2**30:.2f} GiB for {keep} checkpoint(s)",
        passed,
        advice,
    )


def not_writable(folder: Path) -> str | None:
    """Why a file cannot be created in the folder (or the nearest existing folder above it), or None."""
    existing = next(p for p in (folder.resolve(), *folder.resolve().parents) if p.exists())
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".finetune-doctor-"):
            return None
    except OSError as error:
        return error.strerror or str(error)


def output_dir_check(model_args, training_args) -> Check:
    """What `finetune run` decides before training: a folder in use, or holding another run's results
    that neither --resume nor --overwrite_output_dir says what to do with, is refused there."""
    from finetune.outputs import check_claimable, read_holder, results_to_judge
    from finetune.run_folder import LOCK_FILE

    folder = Path(training_args.output_dir)
    expected = "free, or --resume / --overwrite_output_dir for an earlier run's results"
    unwritable = not_writable(folder)
    if unwritable:
        return Check("output_dir", f"{folder}: cannot write ({unwritable})", "a folder this user can write",
                     False, "choose another --output_dir")  # fmt: skip
    holder = read_holder(folder / LOCK_FILE)
    if holder is not None and not holder.is_gone():
        return Check("output_dir", f"in use by pid {holder.pid} on {holder.host}", expected, False,
                     "wait for that run, or choose another --output_dir")  # fmt: skip
    found = results_to_judge(folder)
    if not found:
        return Check("output_dir", f"{folder}: no earlier results", expected, True)
    names = ", ".join(path.name for path in found[:4]) + (", ..." if len(found) > 4 else "")
    if training_args.resumes_a_run:
        return Check("output_dir", f"{folder}: {names} (continued: --resume)", expected, True)
    try:  # the run's own verdict, worded as the run would refuse
        check_claimable(folder, False, training_args.overwrite_output_dir, model_args.folders_read())
    except FinetuneError as error:
        return Check("output_dir", str(error), expected, False, "as the line says, or another --output_dir")
    return Check("output_dir", f"{folder}: {names} (replaced: --overwrite_output_dir)", expected, True)


def gpu_checks(training_args) -> list[Check]:
    if not torch.cuda.is_available():
        return [Check("GPUs", "none visible", "GPUs for a GPU run (CPU ranks use gloo)", True)]
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    capability = f"{properties.major}.{properties.minor}"
    needed = "8.9" if training_args.fp8 else "8.0" if training_args.bf16 else "7.0"
    passed = (properties.major, properties.minor) >= tuple(int(part) for part in needed.split("."))
    return [
        Check(
            "GPU",
            f"{properties.name}, {properties.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}",
            "visible",
            True,
        ),
        Check(
            "compute capability",
            capability,
            f">= {needed} for the precision asked",
            passed,
            "" if passed else "--precision fp16, or no --fp8",
        ),
    ]


def planned(model_args, data_args, training_args, launch: Launch):
    from finetune.calibration import measured_calibration
    from finetune.memory_model import estimate
    from finetune.planner import run_workload

    shape, workload = run_workload(model_args, data_args, training_args)
    return estimate(launch.strategy, shape, workload, launch.layout, measured_calibration())


def memory_check(model_args, data_args, training_args, launch: Launch) -> Check | None:
    """The planner's prediction for this run (its profile, micro batch, block, precision) against this
    GPU's memory; none without a GPU, where the memory model (fitted to GPU peaks) does not apply."""
    if not launch.on_gpu:
        return None
    from finetune.memory_model import DEFAULT_MARGIN
    from finetune.planner import visible_gpu_memory_gib

    predicted = planned(model_args, data_args, training_args, launch).total
    memory = visible_gpu_memory_gib()
    passed = predicted <= memory * (1 - DEFAULT_MARGIN)
    advice = "" if passed else "`finetune plan` shows what fits: a smaller --batch_size, another profile"
    measured = f"{predicted:.1f} GiB predicted of {memory:.0f} GiB"
    return Check(
        "memory (planner)", measured, f"<= {100 * (1 - DEFAULT_MARGIN):.0f}% of the GPU", passed, advice
    )


def host_memory_check(model_args, data_args, training_args, launch: Launch) -> Check | None:
    """Offload profiles keep the optimizer (and parameters) in host RAM, once per rank of a machine:
    the planner's host figure for this machine's ranks against the RAM available now."""
    if "cpu" not in launch.strategy.offloaded.values():
        return None
    ranks_here = launch.processes_per_machine
    needed = planned(model_args, data_args, training_args, launch).host_per_gpu * ranks_here
    available = psutil.virtual_memory().available / 2**30
    passed = needed <= available
    return Check(
        "host RAM (offload)",
        f"{available:.1f} GiB available",
        f">= {needed:.1f} GiB for {ranks_here} rank(s) of this machine",
        passed,
        "" if passed else "fewer ranks per machine, a smaller model, or a machine with more RAM",
    )


def nvme_check(training_args, strategy, device_type: str) -> Check | None:
    """ZeRO-Infinity swaps states through --nvme_path every step: its sequential write and read speed,
    the read from the disk (the page cache dropped for the file first)."""
    if "nvme" not in strategy.offloaded.values() or not training_args.nvme_path:
        return None
    folder = Path(training_args.nvme_path)
    folder.mkdir(parents=True, exist_ok=True)
    probe, size = folder / f".finetune-doctor-{os.getpid()}", NVME_PROBE_BYTES[device_type]
    chunk = os.urandom(min(size, 64 << 20))
    try:
        started = time.monotonic()
        with open(probe, "wb") as stream:
            for _ in range(size // len(chunk)):
                stream.write(chunk)
            stream.flush()
            os.fsync(stream.fileno())
        write = size / (time.monotonic() - started) / 1e9
        with open(probe, "rb") as stream:
            os.posix_fadvise(stream.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            started = time.monotonic()
            while stream.read(64 << 20):
                pass
        read = size / (time.monotonic() - started) / 1e9
    finally:
        probe.unlink(missing_ok=True)
    passed = min(write, read) >= NVME_FLOOR_GBPS
    return Check(
        "NVMe folder speed",
        f"write {write:.2f} GB/s, read {read:.2f} GB/s in {folder}",
        f">= {NVME_FLOOR_GBPS} GB/s each",
        passed,
        "" if passed else "point --nvme_path at a local NVMe disk, or use zero3_offload (host RAM)",
    )


def ops_needed(strategy, on_gpu: bool) -> list[str]:
    """The DeepSpeed op builders a profile's first step builds: the CPU Adam of offloaded optimizer
    states, the async I/O of NVMe swapping, and on CPU ranks the shared-memory collectives."""
    if strategy.framework != "deepspeed":
        return []
    needed = [] if on_gpu else ["ShareMemCommBuilder"]
    if strategy.offloaded:
        needed.append("CPUAdamBuilder")
    if "nvme" in strategy.offloaded.values():
        needed.append("AsyncIOBuilder")
    return needed


def op_build_checks(strategy, on_gpu: bool) -> list[Check]:
    """Each op the profile needs built now (or loaded, when built before), in a child process with a
    time limit: a run then starts without the build, and a build that cannot finish shows here. A
    child stopped at the limit leaves its build lock, which doctor removes (it knows the holder died)."""
    checks = []
    blocked = build_lock_problem(one_machine=True)
    expected = f"built within {OP_BUILD_LIMIT_S} s"
    for builder in ops_needed(strategy, on_gpu):
        if blocked:  # its build would wait on that lock until the time limit: say so at once
            measured, advice = "not built: a build lock blocks it", "see the op build locks row"
            checks.append(Check(f"DeepSpeed op {builder}", measured, expected, False, advice))
            continue
        code = (
            "from deepspeed.accelerator import get_accelerator\n"
            f"builder = get_accelerator().create_op_builder({builder!r})\n"
            "assert builder.is_compatible(verbose=False), 'not compatible with this machine'\n"
            "builder.load(verbose=False)"
        )
        started = time.monotonic()
        try:
            result = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=OP_BUILD_LIMIT_S
            )
        except subprocess.TimeoutExpired:
            for lock in stale_build_locks(extensions_root()):
                lock.unlink(missing_ok=True)
            advice = "build it ahead on this machine: DS_BUILD_OPS=1 pip install deepspeed"
            checks.append(Check(f"DeepSpeed op {builder}", "not built in time", expected, False, advice))
            continue
        if result.returncode == 0:
            measured = f"ready in {time.monotonic() - started:.0f} s"
            checks.append(Check(f"DeepSpeed op {builder}", measured, expected, True))
        else:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            measured = lines[-1] if lines else f"exit {result.returncode}"
            advice = "install its compiler or library (ds_report lists them)"
            checks.append(Check(f"DeepSpeed op {builder}", measured, expected, False, advice))
    return checks


def slurm_checks(launch: Launch) -> list[Check]:
    """Under SLURM: as many nodes as the launch has machines, one task per node (each task is one
    machine's launcher, as `finetune slurm` writes it), and the rendezvous address the ranks met at."""
    if "SLURM_JOB_ID" not in os.environ:
        return []
    nodes = int(os.environ.get("SLURM_NNODES", "1"))
    tasks = int(os.environ.get("SLURM_NTASKS", str(nodes)))
    machines = launch.machines
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    one_task_each = tasks == nodes
    return [
        Check("SLURM nodes", f"{nodes} node(s), {machines} machine(s) launched", "equal", nodes == machines,
              "" if nodes == machines else "--nodes of finetune slurm and --num_machines must agree"),
        Check("SLURM tasks", f"{tasks} task(s) on {nodes} node(s)", "one launcher task per node",
              one_task_each, "" if one_task_each else "srun --ntasks-per-node=1 (as finetune slurm writes)"),
        Check("rendezvous", address, "the first machine's host and a free port", True),
    ]  # fmt: skip


def link_between_ranks(launch: Launch, device_type: str) -> str:
    """What carries the collectives: the network between machines, NVLink or PCIe between GPUs of
    one machine (NVLink as nvidia-smi reports this GPU's links), shared memory between CPU ranks."""
    if not launch.on_one_machine:
        return "network"
    if device_type == "cpu":
        return "shared memory"
    uuid = torch.cuda.get_device_properties(torch.cuda.current_device()).uuid
    try:
        links = subprocess.run(["nvidia-smi", "nvlink", "--status", "-i", f"GPU-{uuid}"],
                               capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "PCIe"
    return "NVLink" if "GB/s" in links else "PCIe"


def collective_checks(launch: Launch) -> list[Check]:
    """The first collective (the rendezvous all ranks wait for), then bus bandwidth at each size; the
    largest size is held to the floor of the link between the ranks."""
    world_size, on_gpu = launch.world_size, launch.on_gpu
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    started = time.monotonic()
    dist.barrier()
    checks = [Check("first collective", f"{time.monotonic() - started:.2f} s", "seconds, not minutes", True)]
    link = link_between_ranks(launch, device.type)
    floor = BANDWIDTH_FLOOR_GBPS.get(link)
    sizes, repeats = COLLECTIVE_SIZES[device.type], COLLECTIVE_REPEATS[device.type]
    for size in sizes:
        buffer = torch.ones(size // 4, dtype=torch.float32, device=device)
        gathered = torch.empty(world_size * buffer.numel(), dtype=torch.float32, device=device)
        operations = {
            "all-reduce": (functools.partial(dist.all_reduce, buffer), 2 * (world_size - 1) / world_size),
            "all-gather": (
                functools.partial(ALL_GATHER, gathered, buffer),
                (world_size - 1) / world_size,
            ),
        }
        for name, (run, factor) in operations.items():
            run()  # warm-up
            if on_gpu:
                torch.cuda.synchronize()
            started = time.monotonic()
            for _ in range(repeats):
                run()
            if on_gpu:
                torch.cuda.synchronize()
            seconds = (time.monotonic() - started) / repeats
            busbw = size * factor / seconds / 1e9
            judged = floor is not None and size == sizes[-1]
            passed = not judged or busbw >= floor
            checks.append(
                Check(
                    f"{name} {size >> 20} MiB",
                    f"{busbw:.1f} GB/s bus bandwidth",
                    f"{link}: >= {floor:g} GB/s" if judged else f"{link}",
                    passed,
                    ""
                    if passed
                    else f"the ranks do not talk over {link} at its speed: check "
                    "`nvidia-smi topo -m`, NCCL_DEBUG=INFO's transport, NCCL_SOCKET_IFNAME",
                )
            )
    return checks


def run_checks(resolved: ResolvedRun) -> list[Check]:
    """Collectives first, so that the first one times the rendezvous and not a neighbour's checks; then
    each rank's own checks, each machine's (once, by its first rank) and the run's (rank 0), the
    first of them saying which run was checked."""
    model_args, data_args, training_args, launch = (
        resolved.model_args,
        resolved.data_args,
        resolved.training_args,
        resolved.launch,
    )
    rank, world_size, strategy, on_gpu = launch.rank, launch.world_size, launch.strategy, launch.on_gpu
    checks = []
    if world_size > 1:
        if on_gpu:
            torch.cuda.set_device(launch.local_rank)
        # the others wait at the gathering below while a first rank builds ops: up to OP_BUILD_LIMIT_S
        timeout = timedelta(seconds=OP_BUILD_LIMIT_S + GATHER_MARGIN_S)
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=timeout)
        checks += collective_checks(launch)
    checks += [build_lock_check(launch), *gpu_checks(training_args)]
    if launch.local_rank == 0:  # once per machine: its RAM, disks and op builds
        checks += [*op_build_checks(strategy, on_gpu)]
        machine = (
            host_memory_check(model_args, data_args, training_args, launch),
            nvme_check(training_args, strategy, "cuda" if on_gpu else "cpu"),
        )
        checks += [check for check in machine if check]
    if rank == 0:
        checks.append(Check(RUN_CHECKED, resolved.describe(), "the run these flags start", True))
        checks += [*names_check(model_args, data_args), output_dir_check(model_args, training_args)]
        checks.append(disk_check(model_args, training_args))
        memory = memory_check(model_args, data_args, training_args, launch)
        checks += [*([memory] if memory else []), *slurm_checks(launch)]
    if world_size > 1:
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, [asdict(check) | {"rank": rank} for check in checks])
        dist.destroy_process_group()
        checks = [Check(**row) for rows in gathered for row in rows]
    return checks


def table(checks: list[Check]) -> str:
    lines = ["| rank | check | measured | should be | passed | what to do |", "|---|---|---|---|---|---|"]
    for check in checks:
        lines.append(
            f"| {check.rank} | {check.name} | {check.measured} | {check.expected} | "
            f"{'yes' if check.passed else 'NO'} | {check.advice} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    with exit_on_user_error():
        argv = sys.argv[1:] if argv is None else argv
        resolved = resolve_run(argv)  # the run these flags would start: its micro batch, its precision
        checks = run_checks(resolved)
        if resolved.launch.rank != 0:
            return 0 if all(check.passed for check in checks) else CHECK_FAILED_EXIT_CODE
        print(table(checks))
        report = Path(resolved.training_args.output_dir) / DOCTOR_REPORT
        try:
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(json.dumps([asdict(check) for check in checks], indent=1) + "\n")
            where = str(report)
        except OSError as error:
            where = f"{report} not written ({error.strerror or error})"
        failed = [check.name for check in checks if not check.passed]
        verdict = "all checks passed" if not failed else "failed: " + ", ".join(failed)
        print(f"finetune doctor: {verdict}; {where}", file=sys.stderr)
        return CHECK_FAILED_EXIT_CODE if failed else 0


if __name__ == "__main__":
    sys.exit(main())
