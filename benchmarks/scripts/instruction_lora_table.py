"""The ratios of issue 17 item 8 from one instruction_lora.sh folder, as a markdown table.

GSM8K: real and answer tokens/s of finetune (packed) over the plain padded script (target at least
8x real tokens/s). LoRA: tokens/s (target at least 2x) and peak allocated GPU memory (target at most
1x) of finetune over plain Trainer + peft. Each figure is the median over the folder's repeats
(`<setup>.<model>.b<micro batch>.run<N>.json`); a setup whose loss did not fall is marked, since a
run that did not train has no speed worth comparing. finetune's computed tokens are its blocks'
(samples/s x block size); its peak memory is the higher of its set-up and training peaks.
usage: python benchmarks/scripts/instruction_lora_table.py FOLDER
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT = re.compile(r"(?P<setup>[a-z_]+)\.(?P<model>[\w.-]+)\.b(?P<batch>\d+)\.run(?P<run>\d+)\.json")
Summary = dict[str, Any]
Measure = Callable[[Summary], float | None]
PEAK = "peak allocated GiB"


def results(folder: Path) -> dict[str, list[Summary]]:
    """Every run's summary by setup (plain_instruction, finetune_instruction, plain_lora, finetune_lora)."""
    found: dict[str, list[Summary]] = {}
    for path in sorted(folder.glob("*.json")):
        match = RESULT.fullmatch(path.name)
        if match:
            found.setdefault(match["setup"], []).append(json.loads(path.read_text()))
    return found


def field(name: str) -> Measure:
    return lambda run: run.get(name)


def computed_per_second(run: Summary) -> float | None:
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


def median(runs: list[Summary], measure: Measure) -> float | None:
    values = [value for value in map(measure, runs) if value is not None]
    return statistics.median(values) if values else None


def number(value: float | None, form: str) -> str:
    return "n/a" if value is None else format(value, form)


def trained(runs: list[Summary]) -> str:
    """'yes' when every run's last logged loss is below its first, with first -> last of the first run."""
    curves = [[point["loss"] for point in run.get("loss_curve", [])] for run in runs]
    if not curves or any(len(curve) < 2 for curve in curves):
        return "no loss curve"
    falls = all(curve[-1] < curve[0] for curve in curves)
    return f"{'yes' if falls else 'NO'} ({curves[0][0]:.2f} -> {curves[0][-1]:.2f})"


def section(columns: str, rows: list[Row], plain: list[Summary], ours: list[Summary]) -> str:
    lines = [f"| {columns} | finetune / plain | target |", "|---|---|---|---|---|"]
    for what, plain_measure, our_measure, form, target in rows:
        theirs, mine = median(plain, plain_measure), median(ours, our_measure)
        ratio = f"{mine / theirs:.2f}x" if theirs and mine is not None else "n/a"
        lines.append(f"| {what} | {number(theirs, form)} | {number(mine, form)} | {ratio} | {target} |")
    lines.append(f"| loss fell | {trained(plain)} | {trained(ours)} | | |")
    lines.append(f"| runs | {len(plain)} | {len(ours)} | | |")
    return "\n".join(lines)


def table(found: dict[str, list[Summary]]) -> str:
    """The GSM8K and LoRA tables, each only where the folder holds runs of it."""
    sections = [
        ("GSM8K, gpt2-medium from scratch | plain, padded | finetune, packed", GSM8K_ROWS, "instruction"),
        (
            "LoRA r=16 all-linear, Llama architecture | plain Trainer + peft | finetune --peft lora",
            LORA_ROWS,
            "lora",
        ),
    ]
    printed = []
    for columns, rows, task in sections:
        plain, ours = found.get(f"plain_{task}", []), found.get(f"finetune_{task}", [])
        if plain or ours:
            printed.append(section(columns, rows, plain, ours))
    return "\n\n".join(printed)


if __name__ == "__main__":
    print(table(results(Path(sys.argv[1]))))
