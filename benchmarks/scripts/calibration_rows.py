"""Rows for finetune/calibration.json from the summaries `calibrate.sh` left.

usage: python benchmarks/scripts/calibration_rows.py DIR   writes DIR/calibration_rows.json (rows in
calibration.json's form); `tables.py peaks DIR` shows each beside the planner's prediction.
       python benchmarks/scripts/calibration_rows.py --floor CALL   the same from a floor.sh call's
case folders (finetune's runs of an unchanged profile; the command is the case, as NOTES.md beside the
call gives it): accumulation 1 in calibration_rows.json, several micro batches a step in
calibration_rows_accumulated.json (calibration.json's `with_accumulation`, checked only).
"""

from __future__ import annotations

import datetime
import json
import math
import re
import sys
from pathlib import Path

from finetune.model_shapes import model_config
from finetune.workload import ModelShape

PROFILE = re.compile(r"--config_file accelerate_configs/(\w+)\.yaml")
# the last line of a call's gpu.txt: torch, NCCL as a tuple (floor.sh; long_context.sh leaves it out),
# transformers, accelerate, deepspeed
VERSIONS_LINE = re.compile(r"(\S+) (?:\((\d+), (\d+), (\d+)\) )?(\S+) (\S+) (\S+)")


def row(summary: dict, profile: str, command: str, versions: str) -> dict:
    arguments = summary["arguments"]
    # as the run read it, --config_overrides applied (the MLP's width of a larger ladder model)
    config = model_config(summary["model"], arguments.get("config_overrides"))
    shape = ModelShape.from_config(summary["model"], config)  # counted once, for both field groups
    return {
        "model": Path(summary["model"]).name,
        "profile": summary["profile"] or profile,
        "framework": {"DEEPSPEED": "deepspeed", "FSDP": "fsdp"}.get(summary["distributed_type"], "torch"),
        "gpus": summary["world_size"],
        "micro_batch": summary["micro_batch_size"],
        "block_size": arguments["block_size"],
        "dtype": "bf16",
        "gradient_checkpointing": bool(arguments.get("gradient_checkpointing")),
        "peak_allocated_gib": round(summary["memory_peak_allocated_gib_max"], 3),
        "device": summary["device_name"],
        "versions": versions,
        "command": command,
        "date": datetime.date.today().isoformat(),
        "parameters": summary["parameters"],
        "layers": summary["num_layers"],
        "hidden": summary["hidden_size"],
        "vocab": config.vocab_size,
        **({"compiled": True} if summary["torch_compile"] else {}),
        **compile_scope(summary),
        **({"chunked_loss": True} if arguments.get("chunked_loss") else {}),
        **({"sequence_parallel": degree} if (degree := summary.get("sequence_parallel_size", 1)) > 1 else {}),
        **({"ddp_bucket_views": True} if summary.get("ddp_gradient_buckets") == "views" else {}),
        **({"fsdp_units": units} if (units := summary.get("fsdp_units")) is not None else {}),
        **({"fsdp_prefetch": ahead} if (ahead := summary.get("fsdp_prefetch")) else {}),
        "layer_norm": shape.layer_norm,  # what the planner's activation model reads of the architecture
        "gated_mlp": shape.gated_mlp,
        "intermediate": shape.mlp_width,
        **(adapter_fields(summary, shape) if summary.get("peft") else {}),
        **({"fp8": True, "float8_weights": shape.float8_weights} if summary.get("fp8_layers") else {}),
        **evaluation_fields(summary),
    }


def evaluation_fields(summary: dict) -> dict:
    """The final evaluation's peak and its largest micro batch (the flag's, or fewer where each
    process had fewer samples), and whether it ran the eager model, where the run evaluated:
    calibration.json's `evaluations` check the planner's evaluation phase against them."""
    peak = summary.get("memory_eval_peak_allocated_gib_max")
    if peak is None or not summary.get("eval_samples"):
        return {}
    per_process = math.ceil(summary["eval_samples"] / summary["data_parallel_size"])
    micro = min(summary["arguments"]["per_device_eval_batch_size"], per_process)
    fields = {"eval_micro_batch": micro, "eval_peak_allocated_gib": round(peak, 3)}
    if summary.get("evaluation_compiled") is not None:  # summaries before the field: the planner's rule
        fields["evaluated_eager"] = not summary["evaluation_compiled"]
    return fields


def compile_scope(summary: dict) -> dict:
    """Whether accelerate compiled block by block (regional) or the whole model, where a profile may
    do either: single, ddp, ZeRO-1/2 (planned by it, activation_memory.calibration_kind). FSDP2 always
    compiles its blocks and ZeRO-3 its leaf blocks itself; summaries from before the field, whole."""
    by_accelerate = summary["distributed_type"] != "FSDP" and summary.get("zero_stage") != 3
    if not (summary["torch_compile"] and by_accelerate):
        return {}
    return {"compiled_by_blocks": bool(summary.get("torch_compile_regional", False))}


def adapter_fields(summary: dict, shape: ModelShape) -> dict:
    """What the planner needs to count a --peft run's adapters (ModelShape, Workload)."""
    return {
        "peft": summary["peft"],
        "lora_rank": summary["arguments"]["lora_rank"],
        "lora_dropout": summary["arguments"]["lora_dropout"],
        "adapted_in_out": shape.adapted_in_out,
        "adapted_out": shape.adapted_out,
        "trainable_parameters": summary["trainable_parameters"],
    }


def summary_versions(summary: dict) -> str:
    """The libraries a run recorded in its summary, in the rows' words (calibrate.sh keeps no gpu.txt)."""
    libraries = ", ".join(f"{name} {summary[f'{name}_version']}" for name in ("transformers", "accelerate"))
    deepspeed = f", deepspeed {summary['deepspeed_version']}" if summary.get("deepspeed_version") else ""
    cuda = f" (CUDA {summary['cuda_version']})" if summary.get("cuda_version") else ""
    return f"torch {summary['torch_version']}{cuda}, {libraries}{deepspeed}"


def measured_rows(folder: Path) -> list[dict]:
    """A row per completed run that calibrate.sh left in `folder` (a summary beside its command)."""
    rows = []
    for path in sorted(folder.glob("*.json")):
        if path.name == "calibration_rows.json" or not path.with_suffix(".command").exists():
            continue
        summary = json.loads(path.read_text())
        if summary.get("status") != "completed":
            continue
        command = path.with_suffix(".command").read_text().strip()
        rows.append(row(summary, PROFILE.search(command)[1], command, summary_versions(summary)))
    return rows


def versions_of(line: str) -> str:
    found = VERSIONS_LINE.fullmatch(line)
    if not found:
        return ""
    torch, *nccl, transformers, accelerate, deepspeed = found.groups()
    with_nccl = f", NCCL {'.'.join(nccl)}" if nccl[0] else ""
    libraries = f"transformers {transformers}, accelerate {accelerate}, deepspeed {deepspeed}"
    return f"torch {torch}{with_nccl}, {libraries}"


def floor_rows(call: Path, accumulated: bool = False) -> list[dict]:
    """A row per finetune case of a floor.sh call (the plain script's cases have no summary), those of
    one micro batch a step or, `accumulated`, of several."""
    versions = versions_of((call / "gpu.txt").read_text().splitlines()[-1])
    # the machine folder's NOTES.md has the commands, however deep in it the call's cases are
    written = (folder / "NOTES.md" for folder in call.parents if (folder / "NOTES.md").exists())
    notes = next(written, call.parent / "NOTES.md")
    rows = []
    for summary_path in sorted(call.glob("*/run_summary.json")):
        summary = json.loads(summary_path.read_text())
        # a changed copy of a profile (floor.sh keeps its YAML beside the run) is not the profile the
        # planner plans; a micro batch accumulated over several is checked apart from the fit
        changed_profile = any(summary_path.parent.glob("*.yaml"))
        steps = summary["gradient_accumulation_steps"]
        if summary.get("status") != "completed" or changed_profile or (steps > 1) != accumulated:
            continue
        script = "long_context.sh" if (summary_path.parent / "plan.txt").exists() else "floor.sh"
        command = f"{script} case {summary_path.parent.name}: {notes}, {call.relative_to(notes.parent)}"
        measured = row(summary, summary["strategy"], command, versions)
        measured["date"] = summary["started_at"][:10]
        if accumulated:
            measured["gradient_accumulation_steps"] = steps
        rows.append(measured)
    return rows


def main(argv: list[str]) -> None:
    usage = "usage: calibration_rows.py DIR | --floor CALL (a folder of run summaries)"
    if len(argv) not in (1, 2) or (len(argv) == 2) != (argv[0] == "--floor") or not Path(argv[-1]).is_dir():
        sys.exit(usage)
    if argv[0] == "--floor":
        call = Path(argv[1])
        (call / "calibration_rows.json").write_text(json.dumps(floor_rows(call), indent=2) + "\n")
        accumulated = floor_rows(call, accumulated=True)
        if accumulated:
            text = json.dumps(accumulated, indent=2) + "\n"
            (call / "calibration_rows_accumulated.json").write_text(text)
        return
    folder = Path(argv[0])
    (folder / "calibration_rows.json").write_text(json.dumps(measured_rows(folder), indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
