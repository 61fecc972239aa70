"""Every table made from benchmark results, one command per kind of result folder.

usage: python benchmarks/scripts/tables.py KIND PATH [PROFILE... | FLAGS]

  speed             PATH holds <setup>.<model>.b<micro batch>.run<N>.json (finetune summaries, the plain
                    Trainer script's JSON): a row per setup, model and micro batch, the median over runs
                    of tokens of a step over the median step time (one definition for both scripts), its
                    spread, its ratio to the plain script's median, MFU, peak memory, whether it learned
  several_gpus      PATH/speed/<profile>.{plain,finetune}.json (several_gpus.sh): finetune's defaults
                    beside the plain Trainer script under the same profile, per GPU
  instruction_lora  PATH holds instruction_lora.sh's <setup>.<model>.b<batch>.run<N>.json: GSM8K
                    (finetune packed over the plain padded script) and LoRA (over Trainer + peft) ratios
  peaks             PATH and its subfolders hold calibrate.sh runs or floor.sh calls: measured training
                    peaks beside the planner's predictions (calibration_rows.py reads the runs; a floor
                    call's rows are the calibration_rows.json it wrote there)
  float8_census     PATH holds float8_census.py's float8_census.jsonl: per model and regime, the bytes a
                    layer keeps per token and width and per converted weight value, bf16 and float8
  doctor            PATH a folder (several_gpus.sh call 4): doctor's bus bandwidth beside a plain torch
                    loop's per GPU count; PATH a doctor.json: rank 0's rows as doctor prints them
  floor             PATH one floor.sh call: a row per case (finetune's summary or the plain script's JSON)
                    with its rate per GPU as a share of the same call's ddp case
  floor_repeats     PATH a machine's folder of floor.sh calls (call*/): a row per model and case, its
                    repeats (a `#rN` tag) pooled: the median rate per GPU, its spread (lowest-highest), and
                    its ratio to the median of the ddp case with the same flags on that machine
  floor_against     PATH FLAGS: as floor_repeats, each case beside its own profile's case of FLAGS (as a
                    floor.sh case writes them): the median rate's ratio and the peak's
  floor_traces      PATH one floor.sh call: per traced case, each rank's step (GPU compute, NCCL, idle)
                    and the collectives paired across ranks (who arrived last, how long the rest waited)
  floor_spy         PATH one floor.sh call: per case sampled by py-spy (SPY=1+), its median step and each
                    rank's host ms a step in the loop, the shares of FSDP2's hooks, the compiled regions,
                    the backward, the optimizer and the batches, and the function with most self time;
                    the same two for autograd's backward thread where the samples counted it
  floor_inside      PATH the same cases: rank 0's host ms a step inside each function host_samples.py was
                    asked to time (its FUNCTION,... argument), its two threads together
  floor_native      PATH one call of py-spy windows attached after the warm-up with native frames
                    (floor.sh's SPY_NATIVE=1+, host_samples.py --window): per case, rank 0's loop thread
                    and backward thread as shares of the window's ticks, each one's share with no
                    Python frame and in the CUDA driver, and its most self time
  resume            PATH PROFILE... (resume_matches.sh): each resumed run's losses beside the
                    uninterrupted run's
  two_launchers     PATH PROFILE... (two_launchers.sh): two launchers' eval loss beside one launcher's

A page that shows a table puts `<!-- table: python benchmarks/scripts/tables.py KIND PATH -->` above
it; tests/test_docs.py runs that command and compares, so a table changes only by rerunning it:
python benchmarks/scripts/tables.py refresh PAGE... reruns every marked command of those pages and
writes its table in place of the one below the marker.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # finetune, where it is not installed

Summary = dict[str, Any]
Measure = Callable[[Summary], float | None]
BLOCK_SIZE = 1024  # every GPU speed run trains blocks of 1024 tokens


def markdown(columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    columns = list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def read(path: Path) -> Any:
    """A result file's JSON (a summary, or doctor's and the torch loop's lists of rows); {} if missing."""
    return json.loads(path.read_text()) if path.exists() else {}


def median(runs: list[Summary], measure: Measure) -> float | None:
    values = [value for value in map(measure, runs) if value is not None]
    return statistics.median(values) if values else None


# speed --------------------------------------------------------------------------------------------
SETUP_ORDER = ("plain", "finetune-eager", "finetune")  # the baseline first, then the project


def learned(summary: Summary) -> str:
    curve = summary.get("loss_curve") or []
    if len(curve) < 2:
        return "not recorded"
    first, last = curve[0]["loss"], curve[-1]["loss"]
    verdict = "yes" if last < first - 0.5 else "**no**"
    return f"{verdict} ({first:.2f} → {last:.2f})"


def step_rate(run: Summary, micro_batch: int) -> float:
    """Tokens per GPU of an optimizer step (every micro batch it accumulates) over its median time."""
    plain_samples = micro_batch * run.get("gradient_accumulation_steps", 1)  # the plain script's summary
    samples = run.get("global_batch_size", plain_samples) / run.get("world_size", 1)
    return samples * BLOCK_SIZE / run["step_time_median_s"]


def speed(folder: Path) -> str:
    groups: dict[tuple[str, str, int], list[Summary]] = defaultdict(list)
    for path in sorted(folder.glob("*.run*.json")):
        setup_and_model, batch, _ = path.name.removesuffix(".json").rsplit(".", 2)
        setup, model = setup_and_model.split(".", 1)  # a model name may hold dots (llama-0.36b)
        groups[(setup, model, int(batch.lstrip("b")))].append(read(path))
    flops = {Path(s["model"]).name: s for runs in groups.values() for s in runs if "flops_per_token" in s}

    def order(key: tuple[str, str, int]) -> tuple:
        setup, model, batch = key
        rank = SETUP_ORDER.index(setup) if setup in SETUP_ORDER else len(SETUP_ORDER)
        return (model, rank, setup, batch)

    def rates(key: tuple[str, str, int]) -> list[float]:
        return [step_rate(run, key[2]) for run in groups[key]]

    baseline = {key[1]: statistics.median(rates(key)) for key in groups if key[0] == "plain"}
    rows = []
    for key in sorted(groups, key=order):
        setup, model, batch = key
        runs, measured = groups[key], rates(key)
        middle = statistics.median(measured)
        ratio = f"{middle / baseline[model]:.2f}" if model in baseline else "n/a"
        mfu = middle * flops[model]["flops_per_token"] / (flops[model]["peak_tflops"] * 1e12)
        memory = max(
            run.get("memory_peak_allocated_gib_max") or run.get("peak_allocated_gib") for run in runs
        )
        spread = f"{min(measured):,.0f} to {max(measured):,.0f}"
        rows.append(
            [setup, model, batch, len(runs), f"{middle:,.0f}", spread, ratio, f"{100 * mfu:.1f}",
             f"{memory:.1f}", learned(runs[-1])]
        )  # fmt: skip
    columns = ["setup", "model", "micro batch", "runs", "tokens/s (median)", "spread", "x plain", "MFU %"]
    columns += ["peak allocated GiB", "learned (loss at first → last log)"]
    return markdown(columns, rows)


# several_gpus -------------------------------------------------------------------------------------
SEVERAL_GPUS_MICRO_BATCH = 8  # several_gpus.sh's speed cases


def several_gpus(folder: Path) -> str:
    """The plain script's rate is one micro batch's block tokens over its median step (it records step
    times); finetune's is its summary's (tokens of the timed steps over their time)."""
    speed_folder = folder / "speed"
    profiles = [path.name.split(".")[0] for path in sorted(speed_folder.glob("*.finetune.json"))]
    runs = {profile: read(speed_folder / f"{profile}.finetune.json") for profile in profiles}
    ddp = runs["ddp"]["tokens_per_second_per_device"] if "ddp" in runs else None
    rows = []
    for profile in sorted(profiles, key=["ddp", "zero3", "fsdp"].index):
        plain = read(speed_folder / f"{profile}.plain.json")
        plain_rate = BLOCK_SIZE * SEVERAL_GPUS_MICRO_BATCH / plain["step_time_median_s"]
        run = runs[profile]
        rate = run["tokens_per_second_per_device"]
        rows.append(
            [profile, f"{plain_rate:,.0f}", f"{plain['peak_allocated_gib']:.1f}", f"{rate:,.0f}",
             f"{run['memory_peak_allocated_gib_max']:.1f}", f"{rate / plain_rate:.2f}x",
             f"{100 * rate / ddp:.0f}%", f"{100 * run['mfu']:.1f}%", "yes" if run["torch_compile"] else "no"]
        )  # fmt: skip
    columns = [
        "profile", "plain tokens/s per GPU", "plain peak GiB", "finetune tokens/s per GPU",
        "finetune peak GiB", "finetune / plain", "% of finetune's DDP", "finetune MFU", "compiled",
    ]  # fmt: skip
    return markdown(columns, rows)


# instruction_lora ---------------------------------------------------------------------------------
RESULT = re.compile(r"(?P<setup>[a-z_]+)\.(?P<model>[\w.-]+)\.b(?P<batch>\d+)\.run(?P<run>\d+)\.json")
PEAK = "peak allocated GiB"


def results(folder: Path) -> dict[str, list[Summary]]:
    """Every run's summary by setup (plain_instruction, finetune_instruction, plain_lora, finetune_lora)."""
    found: dict[str, list[Summary]] = {}
    for path in sorted(folder.glob("*.json")):
        match = RESULT.fullmatch(path.name)
        if match:
            found.setdefault(match["setup"], []).append(read(path))
    return found


def field(name: str) -> Measure:
    return lambda run: run.get(name)


def computed_per_second(run: Summary) -> float | None:
    """finetune's computed tokens are its blocks' (samples/s x block size)."""
    if run.get("samples_per_second") is None:
        return None
    return run["samples_per_second"] * run["block_size"]


def padding_share(run: Summary) -> float | None:
    """Over the timed steps, as the plain scripts measure it."""
    computed = computed_per_second(run)
    return (
        None
        if not computed or run.get("tokens_per_second") is None
        else 1 - run["tokens_per_second"] / computed
    )


def peak(run: Summary) -> float | None:
    """The higher of the set-up and training peaks: the plain scripts' peak is over the whole process."""
    peaks = [run.get(key) for key in ("memory_setup_peak_allocated_gib_max", "memory_peak_allocated_gib_max")]
    return max((value for value in peaks if value is not None), default=None)


# (what, the plain script's figure, finetune's figure, format, target of finetune / plain)
Row = tuple[str, Measure, Measure, str, str]
GSM8K_ROWS: list[Row] = [
    ("real tokens/s", field("tokens_per_second"), field("tokens_per_second"), ",.0f", ">= 8x"),
    ("answer tokens/s", field("trained_tokens_per_second"), field("trained_tokens_per_second"), ",.0f", ""),
    ("computed tokens/s", field("computed_tokens_per_second"), computed_per_second, ",.0f", ""),
    ("padding share of computed tokens", field("padding_share"), padding_share, ".3f", ""),
    (PEAK, field("peak_allocated_gib"), peak, ".2f", ""),
]
LORA_ROWS: list[Row] = [
    ("tokens/s", field("tokens_per_second"), field("tokens_per_second"), ",.0f", ">= 2x"),
    (PEAK, field("peak_allocated_gib"), peak, ".2f", "<= 1x"),
]
INSTRUCTION_LORA_SECTIONS = [  # (columns, rows, task: the setups are plain_<task> and finetune_<task>)
    (["GSM8K, gpt2-medium from scratch", "plain, padded", "finetune, packed"], GSM8K_ROWS, "instruction"),
    (
        ["LoRA r=16 all-linear, Llama architecture", "plain Trainer + peft", "finetune --peft lora"],
        LORA_ROWS,
        "lora",
    ),
]


def number(value: float | None, form: str) -> str:
    return "n/a" if value is None else format(value, form)


def trained(runs: list[Summary]) -> str:
    """'yes' when every run's last logged loss is below its first, with first -> last of the first run:
    a run that did not train has no speed worth comparing."""
    curves = [[point["loss"] for point in run.get("loss_curve", [])] for run in runs]
    if not curves or any(len(curve) < 2 for curve in curves):
        return "no loss curve"
    falls = all(curve[-1] < curve[0] for curve in curves)
    return f"{'yes' if falls else 'NO'} ({curves[0][0]:.2f} -> {curves[0][-1]:.2f})"


def ratio_section(columns: list[str], rows: list[Row], plain: list[Summary], ours: list[Summary]) -> str:
    """Each figure the median over the folder's repeats."""
    lines = []
    for what, plain_measure, our_measure, form, target in rows:
        theirs, mine = median(plain, plain_measure), median(ours, our_measure)
        ratio = f"{mine / theirs:.2f}x" if theirs and mine is not None else "n/a"
        lines.append([what, number(theirs, form), number(mine, form), ratio, target])
    lines.append(["loss fell", trained(plain), trained(ours), "", ""])
    lines.append(["runs", len(plain), len(ours), "", ""])
    return markdown([*columns, "finetune / plain", "target"], lines)


def instruction_lora(folder: Path) -> str:
    """The GSM8K and LoRA tables, each only where the folder holds runs of it."""
    found = results(folder)
    printed = []
    for columns, rows, task in INSTRUCTION_LORA_SECTIONS:
        plain, ours = found.get(f"plain_{task}", []), found.get(f"finetune_{task}", [])
        if plain or ours:
            printed.append(ratio_section(columns, rows, plain, ours))
    return "\n\n".join(printed)


# peaks --------------------------------------------------------------------------------------------
def predicted_peak(values: dict, calibration: Any, phase: str | None = None) -> float:
    """What the planner predicts for a calibration row (calibration.json's form): its peak, or the
    total of one `phase` (memory_model's phase names)."""
    from finetune.calibration import Measurement, estimate_for
    from finetune.profiles import load_profile

    measurement = Measurement.from_row(values, load_profile(values["profile"]).strategy)
    estimate = estimate_for(measurement, calibration)
    return estimate.total if phase is None else estimate.phase_totals[phase]


def peaks(folder: Path) -> str:
    # imported here: the planner and transformers are needed by the peak kinds alone
    from calibration_rows import measured_rows

    from finetune.calibration import measured_calibration

    calibration = measured_calibration()
    rows = []
    for each in [folder, *sorted(path for path in folder.iterdir() if path.is_dir())]:
        floor_call = each / "calibration_rows.json"  # calibration_rows.py --floor's, beside the cases
        for values in json.loads(floor_call.read_text()) if floor_call.exists() else measured_rows(each):
            measured, predicted = values["peak_allocated_gib"], predicted_peak(values, calibration)
            profile = values["profile"] + (f" --peft {values['peft']}" if values.get("peft") else "")
            profile += " (compiled whole)" if values.get("compiled_by_blocks") is False else ""
            profile += " --fp8" if values.get("fp8") else ""
            rows.append(
                [values["model"], profile, values["gpus"], values["micro_batch"], f"{measured:.2f}",
                 f"{predicted:.2f}", f"{predicted / measured:.2f}"]
            )  # fmt: skip
    columns = ["model", "profile", "GPUs", "micro batch", "measured GiB", "predicted GiB"]
    columns.append("predicted/measured")
    return markdown(columns, rows)


def evaluations(folder: Path) -> str:
    """Every final evaluation's peak in the calibration rows under `folder` (calibration_rows.py's,
    of calibrate.sh's runs or beside long_context.sh's cases) beside the planner's evaluation phase,
    with the forward the planner counts (eager or compiled: activation_memory.evaluates_eager)."""
    from finetune.activation_memory import evaluates_eager
    from finetune.calibration import Measurement, estimate_for, measured_calibration
    from finetune.memory_model import EVALUATION
    from finetune.profiles import load_profile

    calibration = measured_calibration()
    rows = []
    for path in sorted(folder.rglob("calibration_rows.json")):
        for values in json.loads(path.read_text()):
            if "eval_peak_allocated_gib" not in values:
                continue
            measurement = Measurement.from_row(values, load_profile(values["profile"]).strategy)
            measured = values["eval_peak_allocated_gib"]
            predicted = estimate_for(measurement, calibration).phase_totals[EVALUATION]
            loss = "chunked" if values.get("chunked_loss") else "the model's own"
            forward = "eager" if evaluates_eager(measurement.strategy, measurement.workload) else "compiled"
            rows.append(
                [values["model"], values["profile"], values["gpus"], f"{values['block_size']:,}", loss,
                 forward, values["eval_micro_batch"], f"{measured:.2f}", f"{predicted:.2f}",
                 f"{predicted / measured:.2f}"]
            )  # fmt: skip
    columns = ["model", "profile", "GPUs", "block", "loss", "forward", "evaluation micro batch",
               "measured GiB", "predicted GiB"]  # fmt: skip
    return markdown([*columns, "predicted/measured"], rows)


# a row's case folder: "case long_single/NAME" (written by hand) or "case NAME: ..." (calibration_rows.py)
def float8_census(folder: Path) -> str:
    """float8_census.py's rows (PATH/float8_census.jsonl): per model and regime, what one layer keeps
    for the backward per token and width and per value of the weights --fp8 converts, bf16 against
    float8, and the differences the planner counts (calibration.json's float8 constants)."""
    from llama_shapes import CENSUS_MODELS, llama_config

    from finetune.model_shapes import shape_of
    from finetune.workload import ModelShape

    def weights_per_layer(model: str) -> float:
        if model in CENSUS_MODELS:
            shape = ModelShape.from_config(model, llama_config(CENSUS_MODELS[model]))
        else:
            shape, _ = shape_of(model)
        return shape.float8_weights / shape.layers

    counted: dict[tuple[str, str], dict[bool, dict]] = defaultdict(dict)
    for line in (folder / "float8_census.jsonl").read_text().splitlines():
        row = json.loads(line)
        counted[row["model"], row["regime"]][row["fp8"]] = row
    rows = []
    for (model, regime), by_fp8 in counted.items():
        if set(by_fp8) != {False, True}:
            continue
        weights = weights_per_layer(model)
        per_token = [by_fp8[fp8]["layer_bytes_per_token_hidden"] for fp8 in (False, True)]
        per_weight = [by_fp8[fp8]["layer_fixed"] / weights for fp8 in (False, True)]
        rows.append(
            [model, regime, *(f"{value:.2f}" for value in per_token), f"{per_token[1] - per_token[0]:+.2f}",
             *(f"{value:.2f}" for value in per_weight), f"{per_weight[1] - per_weight[0]:+.2f}"]
        )  # fmt: skip
    columns = ["model", "regime", "bf16 per token and width", "float8", "difference"]
    return markdown([*columns, "bf16 per weight value", "float8", "difference"], rows)


LONG_BLOCK_CASE = re.compile(r"case (?:\S+/)?([^/:\s]+)")


def long_blocks(folder: Path) -> str:
    """long_context.sh's cases (one folder per set, with its lines.txt and calibration_rows.py
    --floor's rows beside them; floor.sh's calls in the same machine folder are not long blocks):
    each block's peak beside the planner's prediction, with its speed."""
    from finetune.calibration import measured_calibration

    calibration = measured_calibration()
    rows = []
    long_context_sets = (path for path in folder.iterdir() if (path / "lines.txt").exists())
    for each in sorted(path for path in long_context_sets if (path / "calibration_rows.json").exists()):
        for values in json.loads((each / "calibration_rows.json").read_text()):
            measured, predicted = values["peak_allocated_gib"], predicted_peak(values, calibration)
            case = LONG_BLOCK_CASE.search(values["command"])[1]
            summary = json.loads((each / case / "run_summary.json").read_text())
            loss = "chunked" if values.get("chunked_loss") else "the model's own"
            rows.append(
                [values["model"], values["profile"], values.get("sequence_parallel", 1),
                 "yes" if values.get("compiled") else "no", f"{values['block_size']:,}", loss,
                 f"{summary['tokens_per_second_per_device']:,.0f}", f"{summary['mfu']:.1%}",
                 f"{measured:.2f}", f"{predicted:.2f}", f"{predicted / measured:.2f}"]
            )  # fmt: skip
    columns = ["model", "profile", "split over", "compiled", "block", "loss", "tokens/s per GPU", "MFU"]
    return markdown([*columns, "measured GiB", "predicted GiB", "predicted/measured"], rows)


# doctor -------------------------------------------------------------------------------------------
COLLECTIVE_ROW = re.compile(r"(all-reduce|all-gather) (\d+) MiB")


def doctor(path: Path) -> str:
    """Doctor's figure is rank 0's row (time.monotonic around a few calls, a user's first look); the torch
    loop's is collective_loop.py (CUDA events around 50 calls), both bus bandwidth. Every rank runs the
    same per-rank checks, so one doctor.json is shown by rank 0's rows."""
    from finetune.doctor import Check, table

    if not path.is_dir():
        return table([Check(**row) for row in read(path) if row["rank"] == 0])
    rows = []
    for loop_file in sorted(path.glob("torch-*.json")):
        gpus = int(loop_file.stem.split("-")[1])
        loop = {(row["operation"], row["bytes"] >> 20): row["busbw_gbps"] for row in read(loop_file)}
        for row in read(path / f"ddp-{gpus}.json"):
            found = COLLECTIVE_ROW.fullmatch(row["name"])
            if row["rank"] != 0 or not found:
                continue
            measured = float(row["measured"].split()[0])
            reference = loop[(found.group(1), int(found.group(2)))]
            rows.append(
                [gpus, found.group(1), f"{found.group(2)} MiB", f"{measured:.1f}", f"{reference:.1f}",
                 f"{measured / reference:.2f}"]
            )  # fmt: skip
    columns = ["GPUs", "collective", "size", "doctor GB/s", "torch loop GB/s", "doctor / torch loop"]
    return markdown(columns, rows)


# resume -------------------------------------------------------------------------------------------
RESUME_RUNS = ("straight", "stopped", "resumed", "smaller")


def losses(summary: Summary) -> dict[int, float]:
    return {point["step"]: point["loss"] for point in summary.get("loss_curve", [])}


def window_starts(curve: dict[int, float]) -> dict[int, int]:
    """For each logged step but the first, the logged step before it: its loss is the mean since."""
    return {step: before for before, step in itertools.pairwise(sorted(curve))}


def largest_relative_difference(run: Summary, straight: Summary) -> float | None:
    """Over the logged steps both runs trained after the resume point (None if there are none). A
    logged loss is the mean since the previous log, so a resume between two logs leaves the first
    window after it shorter in the resumed run: only windows that start at or after the resume
    point are compared."""
    start = run.get("resumed_from_step") or 0
    mine, theirs = losses(run), losses(straight)
    window_start = window_starts(theirs)
    steps = [step for step in mine if window_start.get(step, -1) >= start and step in theirs]
    if not steps:
        return None
    return max(abs(mine[step] - theirs[step]) / abs(theirs[step]) for step in steps)


def eval_loss_difference(run: Summary, reference: Summary) -> str:
    """The runs' final evaluation losses apart, relative to the reference's; '' where either lacks one."""
    mine, theirs = run.get("eval_loss"), reference.get("eval_loss")
    return f"{abs(mine - theirs) / theirs:.1e}" if mine is not None and theirs else ""


def resume(folder: Path, profiles: list[str]) -> str:
    """Every profile the folder holds an uninterrupted run of, unless profiles are named."""
    profiles = profiles or sorted(path.name.split(".")[0] for path in folder.glob("*.straight.json"))
    rows = []
    for profile in profiles:
        straight = read(folder / f"{profile}.straight.json")
        for run in RESUME_RUNS:
            summary = read(folder / f"{profile}.{run}.json")
            if not summary and run == "smaller" and straight.get("world_size") == 1:
                continue  # one process has no half to resume on
            if not summary:
                rows.append([profile, run, "missing", "", "", "", "", "", ""])
                continue
            eval_loss = summary.get("eval_loss")
            compared = run != "straight"
            eval_diff = eval_loss_difference(summary, straight) if compared else ""
            step_diff = largest_relative_difference(summary, straight) if compared else None
            rows.append(
                [profile, run, summary.get("status"), summary.get("resumed_from_step") or "",
                 summary.get("world_size"), summary.get("steps"),
                 "" if eval_loss is None else f"{eval_loss:.4f}", eval_diff,
                 "" if step_diff is None else f"{step_diff:.1e}"]
            )  # fmt: skip
    columns = ["profile", "run", "status", "resumed from", "world size", "steps", "eval loss"]
    columns += ["eval loss vs uninterrupted", "largest step-loss difference"]
    return markdown(columns, rows)


def resume_steps(folder: Path, profiles: list[str]) -> str:
    """Every logged loss from the resume point on, the uninterrupted run's beside the two resumed
    ones (a window the resume cut short is marked, as it averages fewer steps)."""
    profiles = profiles or sorted(path.name.split(".")[0] for path in folder.glob("*.straight.json"))
    rows = []
    for profile in profiles:
        straight = losses(read(folder / f"{profile}.straight.json"))
        resumed = {run: read(folder / f"{profile}.{run}.json") for run in ("resumed", "smaller")}
        first = min((summary.get("resumed_from_step") or 0) for summary in resumed.values())
        window_start = window_starts(straight)
        for step in sorted(step for step in straight if step > first):
            cells = [profile, str(step), f"{straight[step]:.5f}"]
            for summary in resumed.values():
                loss = losses(summary).get(step)
                short = window_start.get(step, -1) < (summary.get("resumed_from_step") or 0)
                cells.append("" if loss is None else f"{loss:.5f}" + (" (shorter window)" if short else ""))
            rows.append(cells)
    columns = ["profile", "step", "uninterrupted", "resumed on the same GPUs", "resumed on half the GPUs"]
    return markdown(columns, rows)


def resume_modes(folder: Path, reference: list[str]) -> str:
    """Each profile's runs in `folder` against the uninterrupted run of the same profile in the
    reference folder (the same flags under another compile mode, say): whether a mode changes what is
    learned, the logged losses and the evaluation."""
    other = Path(reference[0])
    rows = []
    for path in sorted(folder.glob("*.straight.json")):
        profile = path.name.split(".")[0]
        theirs = read(other / f"{profile}.straight.json")
        if not theirs:
            continue
        for run in RESUME_RUNS:
            mine = read(folder / f"{profile}.{run}.json")
            if not mine:
                continue
            step_diff = largest_relative_difference(mine, theirs)
            rows.append(
                [profile, run, mine.get("status"), mine.get("steps"), eval_loss_difference(mine, theirs),
                 "" if step_diff is None else f"{step_diff:.1e}"]
            )  # fmt: skip
    columns = ["profile", "run", "status", "steps", "eval loss vs reference", "largest step-loss difference"]
    return markdown(columns, rows)


# two_launchers ------------------------------------------------------------------------------------
def two_launchers(folder: Path, profiles: list[str]) -> str:
    rows = []
    for profile in profiles:
        one = read(folder / f"{profile}.one-launcher.json")
        two = read(folder / f"{profile}.two-launchers.json")
        for run, summary in (("one launcher", one), ("two launchers", two)):
            loss, reference = summary.get("eval_loss"), one.get("eval_loss")
            difference = f"{abs(loss - reference):.2e}" if loss is not None and reference is not None else ""
            rows.append(
                [profile, run, summary.get("status"), summary.get("world_size"), summary.get("num_hosts"),
                 loss, difference]
            )  # fmt: skip
    columns = ["profile", "run", "status", "world size", "machines", "eval loss"]
    columns.append("difference to one launcher")
    return markdown(columns, rows)


# floor --------------------------------------------------------------------------------------------
def floor_cases(folder: Path) -> dict[str, Summary]:
    """Each case folder's result: finetune's summary, or the JSON of a run without finetune (marked
    `plain`): the plain Trainer script's or the bare torch loop's (bare_loop.py)."""
    cases = {}
    for case in sorted(path for path in folder.iterdir() if path.is_dir()):
        if (case / "run_summary.json").exists():
            cases[case.name] = read(case / "run_summary.json")
            continue
        for peer in (case / "plain.json", case / "bare.json"):
            if peer.exists():
                cases[case.name] = {"plain": True, **read(peer)}
                break
    return cases


def floor(folder: Path) -> str:
    """Traced cases are left out of the rates (the profiler slows their steps)."""
    cases = {name: run for name, run in floor_cases(folder).items() if "trace" not in name}
    ddp = cases.get("ddp", {}).get("tokens_per_second_per_device")
    rows = []
    for name, run in cases.items():
        if run.get("plain"):
            rate, peak_gib, mfu = run["tokens_per_second"], run["peak_allocated_gib"], None
        else:
            rate, peak_gib, mfu = (
                run["tokens_per_second_per_device"],
                run["memory_peak_allocated_gib_max"],
                run["mfu"],
            )
        if rate is None:  # a run that failed before its first step
            rows.append([f"`{name}`", *["n/a"] * 5, run.get("status", "failed")])
            continue
        status = "" if run.get("status", "completed") == "completed" else f" ({run['status']})"
        rows.append(
            [f"`{name}`", f"{rate:,.0f}{status}", f"{1e3 * run['step_time_median_s']:.0f}",
             number(peak_gib, ".1f"), "n/a" if mfu is None else f"{100 * mfu:.1f}",
             f"{100 * rate / ddp:.0f}%" if ddp else "n/a", learned(run)]
        )  # fmt: skip
    columns = ["case", "tokens/s per GPU", "step ms (median)", "peak allocated GiB", "MFU %", "% of ddp"]
    return markdown([*columns, "learned (loss at first → last log)"], rows)


def floor_gc(folder: Path) -> str:
    """Python's garbage collection beside the rate, from the summaries' gc_* fields and each rank's
    slowest steps; the ratio is against the folder's first case (the one without the lever)."""
    cases = floor_cases(folder)
    first = next(iter(cases.values()))["tokens_per_second_per_device"]
    rows = []
    for name, run in cases.items():
        step, seconds, rank = max(
            ((r["slowest_steps"][0][0], r["slowest_steps"][0][1], r["rank"]) for r in run["ranks"]),
            key=lambda slowest: slowest[1],
        )
        rate = run["tokens_per_second_per_device"]
        rows.append(
            [f"`{name}`", f"{rate:,.0f}", f"{1e3 * run['step_time_median_s']:.0f}",
             f"step {step}: {1e3 * seconds:.0f} ms (rank {rank})", f"{run['gc_full_collections_max']}",
             f"{run['gc_seconds_max']:.2f}", f"{1e3 * run['gc_longest_pause_s']:.0f}",
             f"{rate / first:.2f}"]
        )  # fmt: skip
    columns = ["case", "tokens/s per GPU", "step ms (median)", "slowest step (any rank)"]
    columns += ["full collections per rank (max)", "gc s per rank (max)", "longest gc pause ms"]
    return markdown([*columns, "vs the first case"], rows)


REPEAT_TAG = re.compile(r"_r\d+$")


def pooled_floor_runs(machine: Path) -> dict[tuple[str, str], list[Summary]]:
    """A machine's floor.sh calls (call*/), each case's repeats (a `#rN` tag) pooled by model and
    case; one machine's calls only: rates from two machines are not compared."""
    runs: dict[tuple[str, str], list[Summary]] = defaultdict(list)
    for call in sorted(path for path in machine.glob("call*") if path.is_dir()):  # not the call scripts
        for name, run in floor_cases(call).items():
            if "trace" not in name and not run.get("plain"):
                runs[(run["model"], REPEAT_TAG.sub("", name))].append(run)
    return runs


RATE = field("tokens_per_second_per_device")
STEP = field("step_time_median_s")


def pooled_row(model: str, case: str, repeats: list[Summary]) -> list[Any]:
    rates = [RATE(run) for run in repeats]
    shape = f"{repeats[0]['micro_batch_size']} x {repeats[0]['gradient_accumulation_steps']}"
    return [model, f"`{case}`", shape, len(repeats), f"{median(repeats, RATE):,.0f}",
            f"{min(rates):,.0f}-{max(rates):,.0f}", f"{1e3 * median(repeats, STEP):.0f}",
            f"{highest_peak(repeats):.1f}", f"{100 * median(repeats, field('mfu')):.1f}"]  # fmt: skip


def highest_peak(runs: list[Summary]) -> float:
    return max(run["memory_peak_allocated_gib_max"] for run in runs)


POOLED_COLUMNS = ["model", "case", "micro batch x accumulation", "runs", "tokens/s per GPU (median)"]
POOLED_COLUMNS += ["spread", "step ms (median)", "peak allocated GiB", "MFU %"]


def floor_repeats(machine: Path) -> str:
    """Cases with the same flags train the same global batch, so the ratio of median step times is the
    rate's ratio without the run's slowest steps (a stalled step moves the run's rate, not the median)."""
    runs = pooled_floor_runs(machine)
    rows = []
    for (model, case), repeats in sorted(runs.items()):
        flags = case.partition("_--")[2]
        ddp = runs.get((model, "ddp" + (f"_--{flags}" if flags else "")))
        ratio = median(repeats, RATE) / median(ddp, RATE) if ddp else None
        step_ratio = median(ddp, STEP) / median(repeats, STEP) if ddp else None
        rows.append(
            [*pooled_row(model, case, repeats), "n/a" if ratio is None else f"{ratio:.2f}",
             "n/a" if step_ratio is None else f"{step_ratio:.2f}"]
        )  # fmt: skip
    return markdown([*POOLED_COLUMNS, "vs ddp, same flags", "vs ddp by median step"], rows)


def case_folder(case: str) -> str:
    """The folder floor.sh names a case's results by: the case before its `#` tag through `tr -c
    'A-Za-z0-9_.=-' '_' | cut -c1-80`, one trailing underscore dropped (the echoed newline's, or the
    cut's), then `_TAG` (so a long case's repeats stay apart)."""
    untagged, _, tag = case.partition("#")
    name = re.sub(r"[^A-Za-z0-9_.=-]", "_", untagged + "\n")[:80].removesuffix("_")
    return f"{name}_{tag}" if tag else name


def floor_against(machine: Path, reference: list[str]) -> str:
    """Each case beside its own profile's reference case, the one of the flags given (as a floor.sh
    case writes them: `--gradient_checkpointing,true,--batch_size,8`): the median rate's ratio and the
    peak's, which is how a lever that trades memory for speed (LoRA spending what it frees on a larger
    micro batch) is read; without flags, the profile's own case. Cases of different micro batches
    train different global batches, so the rate per GPU is compared, not the step. A changed copy of a
    profile (`zero2~KEY=VALUE`) is set beside the profile it changes: the strategy its summary names."""
    runs = pooled_floor_runs(machine)
    rows = []
    for (model, case), repeats in sorted(runs.items()):
        profile = repeats[0].get("strategy") or case.partition("_--")[0]
        base = runs.get((model, case_folder(f"{profile}:{','.join(reference)}" if reference else profile)))
        ratio = f"{median(repeats, RATE) / median(base, RATE):.2f}" if base else "n/a"
        peak_ratio = f"{highest_peak(repeats) / highest_peak(base):.2f}" if base else "n/a"
        rows.append([*pooled_row(model, case, repeats), ratio, peak_ratio])
    return markdown([*POOLED_COLUMNS, "rate vs the profile's reference", "peak vs the reference"], rows)


def floor_bare(machine: Path) -> str:
    """finetune's step beside bare_loop.py's (torch alone) for each profile and shape, every call of one
    machine pooled (any depth below it, traced cases left out): the ratio of median steps says how much
    of the step is this project's layers, and each side against its own ddp whether the gap to ddp is
    torch's too."""
    steps: dict[tuple[int, int, str, str], list[float]] = defaultdict(list)
    for result in [*machine.rglob("run_summary.json"), *machine.rglob("bare.json")]:
        if "trace" in result.parent.name:
            continue
        run, tool = read(result), "bare" if result.name == "bare.json" else "finetune"
        micro_batch = run["micro_batch"] if tool == "bare" else run["micro_batch_size"]
        profile = REPEAT_TAG.sub("", result.parent.name).removeprefix("bare_")
        steps[(micro_batch, run["block_size"], profile, tool)].append(run["step_time_median_s"])

    def ratio(numerator: list[float] | None, denominator: list[float] | None) -> str:
        if not numerator or not denominator:
            return "n/a"
        return f"{statistics.median(numerator) / statistics.median(denominator):.2f}"

    def times(runs: list[float] | None) -> str:
        if not runs:
            return "n/a"
        spread = f"{1e3 * min(runs):.0f}-{1e3 * max(runs):.0f}"
        return f"{1e3 * statistics.median(runs):.0f} ({len(runs)}: {spread})"

    rows = []
    for (micro_batch, block, profile, tool), ours in sorted(steps.items()):
        if tool == "bare":
            continue
        alone = steps.get((micro_batch, block, profile, "bare"))
        ddp, alone_ddp = (steps.get((micro_batch, block, "ddp", side)) for side in ("finetune", "bare"))
        rows.append([f"{micro_batch} x {block}", f"`{profile}`", times(ours), times(alone),
                     ratio(ours, alone), ratio(ddp, ours), ratio(alone_ddp, alone)])  # fmt: skip
    columns = ["micro batch x block", "profile", "finetune step ms (runs: range)", "torch alone step ms"]
    columns += ["finetune / torch alone", "finetune vs its ddp", "torch alone vs its ddp"]
    return markdown(columns, rows)


SPY_COLUMNS = {
    "FSDP2 hooks": "FSDP2 hooks and collectives",
    "compiled regions": "compiled regions (guards, wrappers, launches)",
    "backward": "autograd (backward)",
    "optimizer": "optimizer step",
    "batches": "batches (data loader, copies)",
}


def floor_spy(folder: Path) -> str:
    """What each rank's host did in the loop, untraced (host_samples.py's numbers): finetune's cases
    and torch alone's side by side, the shares inclusive (a sample inside a hook inside the backward
    counts in both). Samples that counted autograd's backward thread apart add its columns; those
    that read py-spy's own count of its samples add the share it lost to read errors, which makes the
    host times lower bounds."""
    cases = [
        (samples.parent, list(result["ranks"].values()), result.get("sampler") or {})
        for samples in sorted(folder.glob("*/host_samples.json"))
        for result in [read(samples)]
    ]
    with_backward = any("backward_thread" in rank for _, ranks, _ in cases for rank in ranks)
    with_sampler = any(sampler for _, _, sampler in cases)
    rows = []
    for case, ranks, sampler in cases:
        result = case / "run_summary.json" if (case / "run_summary.json").exists() else case / "bare.json"
        step = read(result).get("step_time_median_s") if result.exists() else None
        host = ", ".join(f"{rank['host_ms_per_step']:.0f}" for rank in ranks)
        shares = [
            "/".join(f"{rank['share_by_category'].get(category, 0):.2f}" for rank in ranks)
            for category in SPY_COLUMNS.values()
        ]
        row = [
            f"`{case.name}`",
            f"{1e3 * step:.0f}" if step else "n/a",
            host,
            *shares,
            top_self(ranks[0] if ranks else {}),
        ]
        if with_backward:
            backward = [rank.get("backward_thread", {}) for rank in ranks]
            row += [", ".join(f"{thread.get('host_ms_per_step') or 0:.0f}" for thread in backward),
                    top_self(backward[0] if backward else {})]  # fmt: skip
        if with_sampler:
            row.append(f"{sampler['errors'] / sampler['samples']:.0%}" if sampler.get("samples") else "n/a")
        rows.append(row)
    columns = ["case", "step ms (median)", "host ms a step in the loop (each rank)"]
    columns += [f"{name} (share, each rank)" for name in SPY_COLUMNS]
    columns.append("most self time, rank 0 (share)")
    if with_backward:
        columns += ["backward thread's host ms a step (each rank)", "its most self time, rank 0 (share)"]
    if with_sampler:
        columns.append("py-spy's samples lost to read errors")
    return markdown(columns, rows)


def floor_inside(folder: Path) -> str:
    """Host ms a step inside each function host_samples.py was asked to time, rank 0, its loop's
    thread and autograd's backward thread together (on CPU the backward runs on the loop's). A case
    whose samples were not asked to time functions has no row: its zeros would read as measured. A
    case whose samples found no rank in the training loop reads n/a throughout, for the same reason."""
    rows, functions = [], {}
    for samples in sorted(folder.glob("*/host_samples.json")):
        ranks = list(read(samples)["ranks"].values())
        if ranks and "inside" not in ranks[0]:
            continue
        inside = None
        if ranks:
            inside = [ranks[0].get("inside", {}), ranks[0].get("backward_thread", {}).get("inside", {})]
        functions.update(dict.fromkeys(name for times in inside or [] for name in times))
        rows.append((samples.parent.name, ranks[0]["host_ms_per_step"] if ranks else None, inside))
    cells = [
        [f"`{case}`", f"{host:.1f}" if host is not None else "n/a",
         *(f"{sum(times.get(name) or 0 for times in inside):.1f}" if inside is not None else "n/a"
           for name in functions)]
        for case, host, inside in rows
    ]  # fmt: skip
    return markdown(["case", "host ms a step in the loop", *(f"`{name}`" for name in functions)], cells)


NATIVE_DRIVER = "the CUDA driver (launches, synchronizes; --native only)"


def floor_native(folder: Path) -> str:
    """Where a step's host time goes once the warm-up is over: each thread's samples as a share of the
    window's ticks (--native pauses the process per sample, so the window's steps are slower and only
    shares are kept), the C++ that sampling without --native never sees, and the driver's part."""
    rows = []
    for samples in sorted(folder.glob("*/native_samples.json")):
        ranks = list(read(samples)["ranks"].values())
        if not ranks:
            rows.append([f"`{samples.parent.name}`", *["n/a"] * 9])
            continue
        loop, backward = ranks[0], ranks[0]["backward_thread"]
        shares = (loop["share_of_window"], backward["share_of_window"])
        cells = [f"`{samples.parent.name}`", *(f"{share:.2f}" for share in (*shares, sum(shares)))]
        for thread in (loop, backward):
            cells += [f"{thread.get('share_without_python_frame', 0):.2f}",
                      f"{thread['share_by_category'].get(NATIVE_DRIVER, 0):.2f}"]  # fmt: skip
        rows.append([*cells, top_self(loop), top_self(backward)])
    columns = ["case", "loop thread (share of ticks)", "backward thread", "both"]
    columns += ["loop: no Python frame", "loop: in the CUDA driver"]
    columns += ["backward: no Python frame", "backward: in the CUDA driver"]
    return markdown([*columns, "loop's most self time (share)", "backward's most self time (share)"], rows)


def top_self(thread: dict) -> str:
    top = thread["top_self"][0] if thread.get("top_self") else None
    return f"{top[0]} ({top[1]:.2f})" if top else ""


def floor_traces(folder: Path) -> str:
    rows = []
    for traces in sorted(folder.glob("*/traces.json")):
        analysis = read(traces)
        collectives = analysis.get("collectives", {})
        last = ", ".join(f"{rank}: {count}" for rank, count in collectives.get("last_to_arrive", {}).items())
        waits = "; ".join(
            f"{kind} {numbers['median_kernel_ms']} ms ({numbers['median_transfer_after_last_arrival_ms']})"
            for kind, numbers in collectives.get("by_type", {}).items()
        )
        for rank, summary in analysis["ranks"].items():
            host = "+".join(
                f"{ms:.0f}" for ms in sorted(summary["host_busy_ms_by_thread"].values(), reverse=True)[:2]
            )
            syncs = sum(sync["calls"] for sync in summary["host_syncs_per_step"].values())
            gpu = [
                f"{summary[key]:.0f}" for key in ("step_ms", "gpu_compute_ms", "gpu_nccl_ms", "gpu_idle_ms")
            ]
            first = rank == "0"
            rows.append([f"`{traces.parent.name}`", rank, *gpu, host, f"{syncs:g}", last if first else "",
                         waits if first else ""])  # fmt: skip
    columns = ["case", "rank", "step ms", "GPU compute ms", "NCCL kernels ms", "GPU idle ms"]
    columns += ["host busy ms (two busiest threads)", "host syncs", "last to arrive (collectives)"]
    return markdown([*columns, "median NCCL kernel ms (of it, after the last arrival)"], rows)


KINDS: dict[str, Callable[[Path], str]] = {
    "speed": speed,
    "several_gpus": several_gpus,
    "instruction_lora": instruction_lora,
    "peaks": peaks,
    "long_blocks": long_blocks,
    "evaluations": evaluations,
    "float8_census": float8_census,
    "doctor": doctor,
    "floor": floor,
    "floor_repeats": floor_repeats,
    "floor_gc": floor_gc,
    "floor_traces": floor_traces,
    "floor_bare": floor_bare,
    "floor_spy": floor_spy,
    "floor_inside": floor_inside,
    "floor_native": floor_native,
}
KINDS_WITH_PROFILES: dict[str, Callable[[Path, list[str]], str]] = {
    "floor_against": floor_against,
    "resume": resume,
    "resume_steps": resume_steps,
    "resume_modes": resume_modes,
    "two_launchers": two_launchers,
}


MARKER = re.compile(r"<!-- table: python benchmarks/scripts/tables.py (.+?) -->\n\n")
TABLE = re.compile(r"(?:\|.*\n)+")


def table_for(arguments: list[str]) -> str:
    kind, path, profiles = arguments[0], Path(arguments[1]), arguments[2:]
    return KINDS_WITH_PROFILES[kind](path, profiles) if kind in KINDS_WITH_PROFILES else KINDS[kind](path)


def refresh(page: Path) -> None:
    """Each marked table of `page` replaced by what its command prints now (as many tables, blank
    line between, as the command prints: instruction_lora prints two); a marker with no table below
    it yet gets one."""
    text, at, parts = page.read_text(), 0, []
    for marker in MARKER.finditer(text):
        if marker.start() < at:
            continue
        printed = table_for(marker[1].split()) + "\n"
        end = marker.end()
        if TABLE.match(text, end) is None:  # a new marker: its table goes in above the text below it
            printed += "\n"
        else:
            for count in range(printed.count("\n\n") + 1):
                found = TABLE.match(text, end + (1 if count else 0))
                if found is None:
                    below = marker[0].strip()
                    raise SystemExit(f"tables.py: {page}: fewer tables below '{below}' than it prints")
                end = found.end()
        parts += [text[at : marker.end()], printed]
        at = end
    page.write_text("".join(parts) + text[at:])


def main(argv: list[str]) -> int:
    if argv and argv[0] == "refresh":
        for page in argv[1:]:
            refresh(Path(page))
        return 0
    if len(argv) < 2 or argv[0] not in {*KINDS, *KINDS_WITH_PROFILES}:
        kinds = ", ".join([*KINDS, *KINDS_WITH_PROFILES])
        print(
            f"usage: python benchmarks/scripts/tables.py KIND PATH [PROFILE... | FLAGS] (KIND: {kinds})",
            file=sys.stderr,
        )
        return 2
    kind, path, profiles = argv[0], Path(argv[1]), argv[2:]
    if not path.exists():
        print(f"tables.py: {path} does not exist", file=sys.stderr)
        return 2
    print(table_for([kind, str(path), *profiles]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
