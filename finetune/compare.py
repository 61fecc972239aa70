"""`finetune compare`: run several profiles on the same model and machine, one table of what each costs.

Each profile is a real `accelerate launch` of finetune/run.py into a folder of its own,
`<output_dir>/<profile>-<YYYYmmdd-HHMMSS>/`, in its own process group, with a time limit. Its row
comes from the run summary it leaves; a run that fails, runs out of memory or times out is a row that
says so, and the comparison goes on. Ctrl-C stops the current run and keeps the rows already
measured. The table is written after every profile, so what is on disk is always the comparison so
far. A comparison into a folder that holds an earlier one adds to it: earlier runs' folders are never
written to, and the table holds the earlier rows and the new ones, each with the time it ran.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from finetune.deepspeed_json import NO_JSON_DECIDED_FLAGS, JsonDecidedFlags
from finetune.errors import FinetuneError
from finetune.launch import Placement, launch_command, resolved_profile_file
from finetune.launched import PROFILE_VARIABLE
from finetune.layout import ParallelLayout
from finetune.pictures import bar_label, comparison_picture, number_text
from finetune.profiles import Profile, Strategy, load_profile, shipped_strategies
from finetune.run_folder import SUMMARY_FILE
from finetune.summary import peak_memory, read_summary

STOP_GRACE_S = 30


@dataclass
class Row:
    """One profile's line of the comparison. Memory is per device: the highest rank's peak."""

    profile: str
    status: str
    reason: str = ""
    training: str = ""  # full, lora or dora (--peft)
    world_size: int | None = None
    compiled: bool | None = None
    memory_kind: str = ""
    peak_memory_gib: float | None = None
    planned_peak_gib: float | None = None  # the planner's GiB per GPU for the run that ran
    tokens_per_second_per_device: float | None = None
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    mfu_percent: float | None = None
    step_time_median_s: float | None = None
    eval_perplexity: float | None = None
    started_at: str = ""
    run_dir: str = ""


def planned_peak_gib(strategy: Strategy, summary: dict[str, Any]) -> float:
    """What `finetune plan` predicts per GPU for the run the summary describes: its model, micro
    batch and accumulation, block, dtype, compilation, adapters, float8, FSDP units and processes (tf32
    matmuls are fp32 storage)."""
    from finetune.adapters import ALL_LINEAR
    from finetune.calibration import measured_calibration
    from finetune.memory_model import estimate
    from finetune.model_shapes import shape_of
    from finetune.workload import Workload

    arguments = summary["arguments"]
    targets = arguments.get("lora_target_modules") if summary["peft"] else None
    shape, _ = shape_of(
        summary["model"],
        arguments.get("config_overrides"),
        summary["block_size"],
        adapter_targets=targets or ALL_LINEAR,
    )
    workload = Workload(
        micro_batch=summary["micro_batch_size"],
        block_size=summary["block_size"],
        dtype="fp32" if summary["dtype"] == "tf32" else summary["dtype"],
        gradient_checkpointing=summary["gradient_checkpointing"],
        compiled=summary["torch_compile"],
        peft=summary["peft"],
        lora_rank=arguments.get("lora_rank", Workload.lora_rank),  # the run flags' defaults, once
        lora_dropout=arguments.get("lora_dropout", Workload.lora_dropout),
        accumulation=summary["gradient_accumulation_steps"] or 1,
        chunked_loss=bool(arguments.get("chunked_loss")),
        fp8=bool(summary.get("fp8_layers")),
        fsdp_blocks_per_unit=arguments.get("fsdp_blocks_per_unit") or Workload.fsdp_blocks_per_unit,
        fsdp_prefetch=arguments.get("fsdp_prefetch") or 0,
    )
    layout = ParallelLayout(summary["world_size"], summary.get("sequence_parallel_size") or 1)
    return estimate(strategy, shape, workload, layout, measured_calibration()).total


def row_from_summary(profile: Profile, summary: dict[str, Any]) -> Row:
    memory_kind, peak = peak_memory(summary)
    return Row(
        profile=profile.name,
        status=summary["status"],
        reason=summary["error"] or "",
        training=summary.get("peft") or FULL,
        world_size=summary["world_size"],
        compiled=summary["torch_compile"],
        memory_kind=memory_kind,
        peak_memory_gib=peak,
        planned_peak_gib=planned_peak_gib(profile.strategy, summary),
        tokens_per_second_per_device=summary["tokens_per_second_per_device"],
        tokens_per_second=summary["tokens_per_second"],
        samples_per_second=summary["samples_per_second"],
        mfu_percent=None if summary["mfu"] is None else 100 * summary["mfu"],
        step_time_median_s=summary["step_time_median_s"],
        eval_perplexity=summary["eval_perplexity"],
    )


def failure_reason(log: Path) -> str:
    """The most telling line of a run's log: our error line, an out-of-memory line, or the last one."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for marker in (
        "finetune: error:",
        "OutOfMemoryError",
        "out of memory",
        "Error",
        " stopped with exit code",
    ):
        found = [line for line in lines if marker in line]
        if found:
            return from_our_prefix(found[-1])[:300]
    return from_our_prefix(lines[-1])[:300] if lines else "no output"


def from_our_prefix(line: str) -> str:
    """A line of ours from its `finetune: ` on: a progress bar cut short leaves no newline before it."""
    start = line.rfind("finetune: ")
    return line[start:] if start > 0 else line


def classify(reason: str) -> str:
    return "out of memory" if "out of memory" in reason.lower() else "failed"


def stop_group(process: subprocess.Popen, first: signal.Signals) -> None:
    """Signal the run's whole process group; kill it if it has not exited within the grace period."""
    try:
        os.killpg(process.pid, first)
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def new_run_dir(output_dir: Path, profile: str, started: time.struct_time) -> Path:
    """A folder no earlier run used: `<profile>-<time>`, with a counter if that is taken already."""
    name = f"{profile}-{time.strftime('%Y%m%d-%H%M%S', started)}"
    for attempt in range(1, 1000):
        run_dir = output_dir / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            run_dir.mkdir(parents=True)
        except FileExistsError:
            continue
        return run_dir
    raise FinetuneError(f"{output_dir}: no free folder for {name}")


PROGRESS_POLL_S = 2.0


def latest_step_line(log: Path) -> str | None:
    """The run's newest `step N/M | loss ...` line in its log (the console line it prints at each log)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((line.strip() for line in reversed(lines) if line.lstrip().startswith("step ")), None)


def wait_showing_progress(process: subprocess.Popen, log: Path, name: str, timeout_s: float) -> None:
    """Wait for one run, printing its console line each time it logs: a compare of several long runs
    otherwise says nothing for as long as they take. TimeoutExpired past `timeout_s`."""
    deadline, shown = time.monotonic() + timeout_s, None
    while True:
        try:
            process.wait(timeout=min(PROGRESS_POLL_S, max(deadline - time.monotonic(), 0.01)))
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
        line = latest_step_line(log)
        if line and line != shown:
            print(f"finetune compare: {name}: {line}", file=sys.stderr, flush=True)
            shown = line


def run_profile(
    profile_name: str,
    placement: Placement,
    run_args: list[str],
    run_dir: Path,
    timeout_s: float,
    json_flags: JsonDecidedFlags = NO_JSON_DECIDED_FLAGS,
) -> Row:
    """One run of the comparison, launched as `finetune run` would; a profile that run would refuse
    before launching (no NVMe folder, an --optim its JSON's optimizer overrides) fails here the same
    way without launching, its error line in launch.log."""
    profile = load_profile(profile_name)
    log = run_dir / "launch.log"
    try:
        json_flags.check(profile.deepspeed_config_path, profile.deepspeed_config)
    except FinetuneError as error:
        reason = f"finetune: error: {error}"
        log.write_text(reason + "\n")
        return Row(profile.name, classify(reason), reason)
    flags = ["--save_strategy", "no", *run_args, "--output_dir", str(run_dir), "--run_name", run_dir.name]
    with tempfile.TemporaryDirectory(prefix="finetune-compare-") as folder, log.open("w") as stream:
        # a one-process profile beside several-process ones runs as `finetune run` runs it: alone
        placed = placement if profile.multi_process else Placement()
        command = launch_command(profile, resolved_profile_file(profile, Path(folder)), placed, flags)
        environment = {**os.environ, PROFILE_VARIABLE: profile.name}
        process = subprocess.Popen(
            command, stdout=stream, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
        try:
            wait_showing_progress(process, log, profile.name, timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(process, signal.SIGINT)
            return Row(profile.name, "timeout", f"stopped after {timeout_s:.0f} s")
        except KeyboardInterrupt:
            stop_group(process, signal.SIGINT)
            raise
    if (run_dir / SUMMARY_FILE).exists():
        summary = read_summary(run_dir)
        if summary["status"] == "completed":
            return row_from_summary(profile, summary)
        reason = summary["error"] or failure_reason(log)
        return Row(profile.name, classify(reason), reason)
    reason = failure_reason(log)
    return Row(profile.name, classify(reason), reason)


def default_profiles(run_args: list[str], sequence_parallel: int = 1, on_gpu: bool = True) -> list[str]:
    """Every multi-process profile, fastest first; the NVMe one only when --nvme_path is given; with
    --sequence_parallel, those that split sequences (ring attention only on GPUs)."""
    splits = ("ulysses", "ring") if on_gpu else ("ulysses",)
    return [
        strategy.name
        for strategy in shipped_strategies()
        if strategy.multi_process
        and (not strategy.needs_nvme_path or "--nvme_path" in run_args)
        and (sequence_parallel == 1 or strategy.sequence_split in splits)
    ]


# ---------------------------------------------------------------------------------------------------
# Output files

COLUMNS = {
    "profile": "profile",
    "status": "status",
    "training": "training",
    "world_size": "devices",
    "compiled": "compiled",
    "peak_memory_gib": "peak memory / device (GiB)",
    "planned_peak_gib": "planned GiB / GPU",
    "tokens_per_second_per_device": "tokens/s / device",
    "tokens_per_second": "tokens/s",
    "samples_per_second": "samples/s",
    "mfu_percent": "MFU %",
    "step_time_median_s": "step (s, median)",
    "eval_perplexity": "eval perplexity",
    "started_at": "ran at",
    "reason": "reason",
}


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return number_text(value)
    return str(value).replace("|", "/")


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=[f.name for f in fields(Row)])
        writer.writeheader()
        writer.writerows(asdict(row) for row in rows)


def parse_cell(text: str, kind: Any) -> Any:
    """A CSV cell back as the Row field's type (the CSV is what keeps earlier comparisons' rows)."""
    options = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    if text == "":
        return None if type(None) in options else ""
    base = next(option for option in options if option is not type(None))
    if base is bool:
        return text == "True"
    return base(text)


def read_rows(output_dir: Path) -> list[Row]:
    """The rows of the comparison already in output_dir (none if there is none).

    A row from before runs had folders of their own has its run in `<output_dir>/<profile>/`.
    """
    path = output_dir / "comparison.csv"
    if not path.exists():
        return []
    kinds = typing.get_type_hints(Row)
    try:
        with path.open(newline="") as stream:
            rows = [
                Row(**{name: parse_cell(text, kinds[name]) for name, text in record.items() if name in kinds})
                for record in csv.DictReader(stream)
            ]
    except (OSError, ValueError, TypeError) as error:
        raise FinetuneError(
            f"{path}: cannot read the earlier comparison ({error}); compare into another folder"
        ) from None
    for row in rows:
        if not row.run_dir and (output_dir / row.profile / SUMMARY_FILE).exists():
            row.run_dir = row.profile
    return rows


def merge_rows(earlier: list[Row], new: list[Row]) -> list[Row]:
    """Earlier rows then new ones; a row of the same profile, training and run time is the same run, once."""
    merged = {(row.profile, row.training, row.started_at): row for row in earlier}
    merged.update({(row.profile, row.training, row.started_at): row for row in new})
    return list(merged.values())


FULL = "full"


def comma_separated(flag: str, given: str) -> list[str]:
    """The names of a comma-separated flag, each once: a name given twice would run twice."""
    names = [name.strip() for name in given.split(",") if name.strip()]
    if not names:
        raise FinetuneError(f"{flag} is empty: give names, comma-separated")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise FinetuneError(f"{flag} {given}: {', '.join(repeated)} given more than once")
    return names


def training_variants(given: str | None, run_args: list[str]) -> list[str]:
    """`--variants full,lora`: each profile runs with full fine-tuning, or with `--peft METHOD` added to
    its run flags (the run flag keeps its one meaning). Without it, one run per profile as its run
    flags say ("")."""
    if given is None:
        return [""]
    from finetune.adapters import PEFT_METHODS

    variants = comma_separated("--variants", given)
    unknown = [name for name in variants if name not in (FULL, *PEFT_METHODS)]
    if unknown:
        raise FinetuneError(f"--variants {given}: give {FULL}, {', '.join(PEFT_METHODS)}, comma-separated")
    if "--peft" in run_args:
        raise FinetuneError(
            "give --variants (full,lora: every profile both ways) or --peft in the run flags, not both"
        )
    return variants


def variant_flags(variant: str) -> list[str]:
    return [] if variant in ("", FULL) else ["--peft", variant]


def write_markdown(rows: list[Row], path: Path, header: list[str]) -> None:
    kinds = {row.memory_kind for row in rows if row.memory_kind}
    lines = [*header, ""]
    if kinds:
        lines.append(f"Peak memory is {', '.join(sorted(kinds))}, highest rank.")
        lines.append("")
    lines.append("| " + " | ".join(COLUMNS.values()) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for row in rows:
        lines.append("| " + " | ".join(cell(getattr(row, name)) for name in COLUMNS) + " |")
    path.write_text("\n".join(lines) + "\n")


def loss_curves(rows: list[Row], output_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each run's logged training loss by step, from its summary, by its bar's label."""
    curves = {}
    for row in rows:
        summary_path = output_dir / row.run_dir / SUMMARY_FILE
        if row.run_dir and summary_path.is_file():
            logged = read_summary(output_dir / row.run_dir).get("loss_curve") or []
            curves[bar_label(row)] = [(point["step"], point["loss"]) for point in logged]
    return curves


def write_results(rows: list[Row], output_dir: Path, header: list[str]) -> None:
    write_csv(rows, output_dir / "comparison.csv")
    write_markdown(rows, output_dir / "comparison.md", header)
    comparison_picture(rows, loss_curves(rows, output_dir), output_dir / "comparison.png")


def environment(output_dir: Path, rows: list[Row]) -> str:
    """Device and versions, from the first profile that completed."""
    for row in rows:
        if row.status == "completed" and (output_dir / row.run_dir / SUMMARY_FILE).exists():
            summary = read_summary(output_dir / row.run_dir)
            versions = ", ".join(
                f"{package} {summary[f'{package}_version']}"
                for package in ("torch", "transformers", "accelerate", "deepspeed")
            )
            return f"{summary['world_size']} x {summary['device_name']}; {versions}"
    return "no profile completed"


def compare(
    profiles: list[str],
    placement: Placement,
    run_args: list[str],
    output_dir: Path,
    timeout_s: float,
    command_line: str,
    variants: tuple[str, ...] = ("",),
    json_flags: JsonDecidedFlags = NO_JSON_DECIDED_FLAGS,
) -> list[Row]:
    """Run the profiles in turn, each once per training variant (`training_variants`); the files in
    output_dir are rewritten after every run, with the rows of an earlier comparison there kept.
    `json_flags`: the run flags, as parsed, that a profile's DeepSpeed JSON may refuse. Returns this
    comparison's rows."""
    if output_dir.exists() and not output_dir.is_dir():
        raise FinetuneError(f"--output_dir {output_dir} is a file, not a folder")
    earlier = read_rows(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []

    def save() -> None:
        header = [
            "# finetune compare",
            "",
            f"    {command_line}",
            "",
            environment(output_dir, rows + earlier),
        ]
        if earlier:
            header += [
                "",
                f"{len(earlier)} earlier row(s) of this folder kept; `ran at` tells the runs apart.",
            ]
        write_results(merge_rows(earlier, rows), output_dir, header)

    for name in profiles:
        for variant in variants:
            label = f"{name} ({variant})" if variant else name
            print(f"finetune compare: {label}", file=sys.stderr, flush=True)
            started = time.localtime()
            profile = load_profile(name).name  # a YAML file's rows and folders are named by its stem
            run_dir = new_run_dir(output_dir, f"{profile}-{variant}" if variant else profile, started)
            ran = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S", started), "run_dir": run_dir.name}
            if variant:
                ran["training"] = variant
            try:
                flags = [*run_args, *variant_flags(variant)]
                row = run_profile(name, placement, flags, run_dir, timeout_s, json_flags)
            except KeyboardInterrupt:
                rows.append(Row(profile, "interrupted", "stopped by Ctrl-C", **ran))
                save()
                raise
            rows.append(dataclasses.replace(row, **ran))
            save()
    return rows


def summaries_frame(output_dir: str | Path) -> Any:
    """Every run summary under a comparison folder as a pandas DataFrame, one row per run.

    The flat fields become columns, with `run_dir` the run's folder (a profile compared twice has two
    rows); the per-rank, loss-curve and argument records stay out.
    """
    import pandas as pd

    records = []
    for path in sorted(Path(output_dir).glob(f"*/{SUMMARY_FILE}")):
        summary = read_summary(path.parent)
        flat = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
        records.append(
            {**flat, "profile": summary.get("profile") or path.parent.name, "run_dir": path.parent.name}
        )
    return pd.DataFrame.from_records(records)
