"""A speed table of docs/speed.md, generated from the raw results of one GPU session.

Reads <setup>.<model>.b<micro batch>.run<N>.json files (run_summary.json of finetune runs, the JSON
that plain_trainer.py writes for the baseline) and prints one markdown row per setup, model and
micro batch: the median over runs of the steady-state rate (tokens of a step / median step time,
the same definition for both scripts), its spread, its ratio to the baseline's median for the same
model, MFU, peak memory and whether the run learned.
usage: python benchmarks/scripts/speed_table.py RESULTS_DIR
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

BLOCK_SIZE = 1024
SETUP_ORDER = ("plain", "finetune-eager", "finetune")  # the baseline first, then the project


def learned(summary: dict) -> str:
    curve = summary.get("loss_curve") or []
    if len(curve) < 2:
        return "not recorded"
    first, last = curve[0]["loss"], curve[-1]["loss"]
    verdict = "yes" if last < first - 0.5 else "**no**"
    return f"{verdict} ({first:.2f} → {last:.2f})"


def rate(run: dict, micro_batch: int) -> float:
    """Tokens per GPU of an optimizer step (every micro batch it accumulates) over its median time."""
    plain_samples = micro_batch * run.get("gradient_accumulation_steps", 1)  # the plain script's summary
    samples = run.get("global_batch_size", plain_samples) / run.get("world_size", 1)
    return samples * BLOCK_SIZE / run["step_time_median_s"]


def rows(results: Path) -> list[str]:
    groups: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for path in sorted(results.glob("*.run*.json")):
        setup_and_model, batch, _ = path.name.removesuffix(".json").rsplit(".", 2)
        setup, model = setup_and_model.split(".", 1)  # a model name may hold dots (llama-0.36b)
        groups[(setup, model, int(batch.lstrip("b")))].append(json.loads(path.read_text()))
    flops = {Path(s["model"]).name: s for runs in groups.values() for s in runs if "flops_per_token" in s}
    lines = []

    def order(key: tuple[str, str, int]) -> tuple:
        setup, model, batch = key
        rank = SETUP_ORDER.index(setup) if setup in SETUP_ORDER else len(SETUP_ORDER)
        return (model, rank, setup, batch)

    def median_rate(setup: str, model: str, batch: int) -> float:
        return statistics.median(rate(run, batch) for run in groups[(setup, model, batch)])

    baseline = {model: median_rate(setup, model, batch) for setup, model, batch in groups if setup == "plain"}
    for (setup, model, batch), runs in sorted(groups.items(), key=lambda item: order(item[0])):
        rates = [rate(run, batch) for run in runs]
        ratio = f"{statistics.median(rates) / baseline[model]:.2f}" if model in baseline else "n/a"
        reference = flops[model]
        mfu = statistics.median(rates) * reference["flops_per_token"] / (reference["peak_tflops"] * 1e12)
        memory = max(
            run.get("memory_peak_allocated_gib_max") or run.get("peak_allocated_gib") for run in runs
        )
        lines.append(
            f"| {setup} | {model} | {batch} | {len(runs)} | {statistics.median(rates):,.0f} "
            f"| {min(rates):,.0f} to {max(rates):,.0f} | {ratio} | {100 * mfu:.1f} | {memory:.1f} "
            f"| {learned(runs[-1])} |"
        )
    return lines


if __name__ == "__main__":
    columns = ["setup", "model", "micro batch", "runs", "tokens/s (median)", "spread", "x plain", "MFU %"]
    columns += ["peak allocated GiB", "learned (loss at first → last log)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    print("\n".join(rows(Path(sys.argv[1]))))
