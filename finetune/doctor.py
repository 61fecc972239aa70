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
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file by accelerate launch: import the package, not its siblings
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import finetune  # noqa: F401, I001 (first: its import filters the libraries' known noise)
import torch
import torch.distributed as dist

from finetune.arguments import parse_arguments
from finetune.build_locks import extensions_root, on_one_machine, stale_build_locks
from finetune.errors import CHECK_FAILED_EXIT_CODE, FinetuneError, exit_on_user_error, first_line

REPORT = "doctor.json"
COLLECTIVE_SIZES = (1 << 20, 16 << 20)  # bytes; a GPU machine's bandwidth shows at the larger
CHECKPOINT_BYTES_PER_PARAMETER = 2 + 4 + 8  # bf16 weights, fp32 master and Adam's two states, as saved
# torch renamed the tensor all-gather (and warns at every call of the old name): the new one where it exists
ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


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


def build_lock_check() -> Check:
    stale = stale_build_locks(extensions_root(), on_one_machine())
    if stale:
        return Check(
            "op build locks", f"stale: {stale[0]}", "none left by a dead process", False, f"rm {stale[0]}"
        )
    return Check("op build locks", "none stale", "none left by a dead process", True)


def disk_check(model_args, training_args) -> Check:
    """Free space in output_dir against the checkpoints the run keeps (save_total_limit, and the one
    being written before the oldest is rotated out)."""
    from finetune.disk_space import checkpoints_at_once
    from finetune.planner import shape_of

    folder = Path(training_args.output_dir)
    existing = next(p for p in (folder.resolve(), *folder.resolve().parents) if p.exists())
    free = shutil.disk_usage(existing).free
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


def memory_check(model_args, data_args, training_args) -> Check | None:
    """The planner's prediction for this run (its profile, micro batch, block, precision) against this
    GPU's memory; none without a GPU, where the memory model (fitted to GPU peaks) does not apply."""
    if not torch.cuda.is_available():
        return None
    from finetune.planner import (
        DEFAULT_MARGIN,
        Calibration,
        Workload,
        estimate,
        shape_of,
        visible_gpu_memory_gib,
    )
    from finetune.profiles import launched_strategy

    shape, default_block = shape_of(model_args.model, model_args.config_overrides)
    dtype = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
    workload = Workload(
        micro_batch=training_args.per_device_train_batch_size,
        block_size=data_args.block_size or default_block,
        dtype=dtype,
        gradient_checkpointing=training_args.gradient_checkpointing,
        compiled=training_args.torch_compile,
        peft=model_args.peft,
        lora_rank=model_args.lora_rank,
        lora_dropout=model_args.lora_dropout,
    )
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    predicted = estimate(launched_strategy(), shape, workload, world_size, Calibration.measured()).total
    memory = visible_gpu_memory_gib()
    passed = predicted <= memory * (1 - DEFAULT_MARGIN)
    advice = "" if passed else "`finetune plan` shows what fits: a smaller --batch_size, another profile"
    measured = f"{predicted:.1f} GiB predicted of {memory:.0f} GiB"
    return Check(
        "memory (planner)", measured, f"<= {100 * (1 - DEFAULT_MARGIN):.0f}% of the GPU", passed, advice
    )


def slurm_check() -> Check | None:
    """Under SLURM: as many nodes as the launch has machines."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    nodes = int(os.environ.get("SLURM_NNODES", "1"))
    machines = int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    passed = nodes == machines
    return Check("SLURM nodes", f"{nodes} node(s), {machines} machine(s) launched", "equal", passed,
                 "" if passed else "--nodes of finetune slurm and --num_machines must agree")  # fmt: skip


def collective_checks(rank: int, world_size: int) -> list[Check]:
    """The first collective (the rendezvous all ranks wait for), then bus bandwidth at each size."""
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    started = time.monotonic()
    dist.barrier()
    checks = [Check("first collective", f"{time.monotonic() - started:.2f} s", "seconds, not minutes", True)]
    for size in COLLECTIVE_SIZES:
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
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.monotonic()
            for _ in range(5):
                run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = (time.monotonic() - started) / 5
            busbw = size * factor / seconds / 1e9
            checks.append(
                Check(
                    f"{name} {size >> 20} MiB",
                    f"{busbw:.1f} GB/s bus bandwidth",
                    "NVLink: 100s of GB/s; PCIe: 10s; network: per link",
                    True,
                )
            )
    return checks


def run_checks(argv: list[str]) -> list[Check]:
    model_args, data_args, training_args = parse_arguments(argv)
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    checks = [build_lock_check(), *gpu_checks(training_args)]
    if rank == 0:
        checks += [*names_check(model_args, data_args), disk_check(model_args, training_args)]
        checks += [
            check for check in (memory_check(model_args, data_args, training_args), slurm_check()) if check
        ]
    if world_size > 1:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        checks += collective_checks(rank, world_size)
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, [asdict(check) | {"rank": rank} for check in checks])
        dist.destroy_process_group()
        checks = [Check(**row) for rows in gathered for row in rows]
    return checks


def doctor_verdict(output_dir: Path) -> str | None:
    """For the run summary: "passed", or the checks that failed, as doctor.json in output_dir says."""
    try:
        rows = json.loads((output_dir / REPORT).read_text())
    except (OSError, ValueError):
        return None
    failed = sorted({row["name"] for row in rows if not row.get("passed")})
    return "passed" if not failed else "failed: " + ", ".join(failed)


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
        checks = run_checks(argv)
        if int(os.environ.get("RANK", "0")) != 0:
            return 0 if all(check.passed for check in checks) else CHECK_FAILED_EXIT_CODE
        _, _, training_args = parse_arguments(argv)
        print(table(checks))
        folder = Path(training_args.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / REPORT).write_text(json.dumps([asdict(check) for check in checks], indent=1) + "\n")
        failed = [check.name for check in checks if not check.passed]
        print(
            f"finetune doctor: {'all checks passed' if not failed else 'failed: ' + ', '.join(failed)}; "
            f"{folder / REPORT}",
            file=sys.stderr,
        )
        return CHECK_FAILED_EXIT_CODE if failed else 0


if __name__ == "__main__":
    sys.exit(main())
