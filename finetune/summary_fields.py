"""Where the run summary's fields come from: the library versions and hardware, the configuration,
the data, the model, the trainer's state and the evaluations, each as a dict of FIELDS names for
`RunRecord.update` (finetune/summary.py), which refuses a name FIELDS does not document.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from finetune.adapters import trainable_parameters
from finetune.arguments import as_record
from finetune.callbacks import MemoryCallback
from finetune.checkpoint import checkpoints_newest_first, read_manifest
from finetune.data import DataSummary
from finetune.flops import PeakFlops, matmul_parameters, tf32_matmuls, training_dtype
from finetune.garbage_collection import GarbageCollectionCallback
from finetune.launched import BatchGeometry, Launch
from finetune.models import count_parameters
from finetune.run_folder import DOCTOR_REPORT
from finetune.throughput import ThroughputCallback

PACKAGES = ("torch", "transformers", "accelerate", "deepspeed", "datasets")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {
        "python_version": platform.python_version(),
        "cuda_version": torch.version.cuda,
    }
    for package in PACKAGES:
        try:
            found[f"{package}_version"] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[f"{package}_version"] = None
    return found


def hardware() -> dict[str, Any]:
    if torch.cuda.is_available():
        return {"device_name": torch.cuda.get_device_name(), "device_count": torch.cuda.device_count()}
    return {"device_name": "cpu", "device_count": os.cpu_count()}


def loss_curve(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [{"step": entry["step"], "loss": entry["loss"]} for entry in log_history if "loss" in entry]


def configuration_fields(
    model_args: Any, data_args: Any, training_args: Any, launch: Launch
) -> dict[str, Any]:
    """What the run was asked to do, and on what: known before anything is loaded."""
    geometry = BatchGeometry.of(training_args, launch.data_parallel_size)
    return {
        "profile": launch.profile,
        "model": model_args.model,
        "from_scratch": model_args.from_scratch,
        "peft": model_args.peft,
        "dataset": data_args.dataset,
        "packing": data_args.packing,
        "gradient_checkpointing": training_args.gradient_checkpointing,
        "micro_batch_size": geometry.micro,
        "gradient_accumulation_steps": geometry.accumulation,
        "global_batch_size": geometry.global_batch,
        "batch_choice": training_args.batch_choice,
        "learning_rate": training_args.learning_rate,
        "seed": training_args.seed,
        "dtype": training_dtype(training_args.bf16, training_args.fp16, tf32_matmuls()),
        "arguments": as_record(model_args, data_args, training_args),
        **hardware(),
        **versions(),
    }


def data_fields(location: str, block_size: int, data: DataSummary) -> dict[str, Any]:
    return {
        "model_location": location,
        "data_source": data.source,
        "block_size": block_size,
        "train_samples": data.train_samples,
        "eval_samples": data.eval_samples,
        "train_tokens": data.train_tokens,
        "data_format": data.data_format,
        "masked_tokens": data.masked_tokens,
        "truncated_examples": data.truncated_examples,
        "packing_efficiency": data.packing_efficiency,
        "data_notes": data.notes,
    }


def model_fields(model: Any, config: Any, token_flops: int, peak: PeakFlops | None) -> dict[str, Any]:
    return {
        "parameters": count_parameters(model),
        "trainable_parameters": trainable_parameters(model),
        "matmul_parameters": matmul_parameters(model),
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "flops_per_token": token_flops,
        "peak_tflops": peak.tflops if peak else None,
        "peak_tflops_source": peak.source if peak else None,
    }


def doctor_fields(output_dir: Path) -> dict[str, Any]:
    """ "passed", or the checks that failed, as `finetune run --doctor` left them in doctor.json."""
    try:
        rows = json.loads((output_dir / DOCTOR_REPORT).read_text())
    except (OSError, ValueError):
        return {"doctor": None}
    failed = sorted({row["name"] for row in rows if not row.get("passed")})
    return {"doctor": "passed" if not failed else "failed: " + ", ".join(failed)}


def resume_fields(checkpoint: Path | None) -> dict[str, Any]:
    if checkpoint is None:
        return {"resumed_from": None, "resumed_from_step": None}
    return {"resumed_from": str(checkpoint), "resumed_from_step": read_manifest(checkpoint)["step"]}


def training_fields(
    state: Any,
    output_dir: str,
    train_metrics: dict[str, Any],
    memory: MemoryCallback,
    throughput: ThroughputCallback,
    collections: GarbageCollectionCallback,
) -> dict[str, Any]:
    """What training did: steps, losses, checkpoint, and the callbacks' run-wide measurements."""
    curve = loss_curve(state.log_history)
    checkpoints = checkpoints_newest_first(output_dir)
    return {
        "steps": state.global_step,
        "checkpoint": str(checkpoints[0]) if checkpoints else None,
        "train_loss": train_metrics.get("train_loss"),
        "train_runtime_s": train_metrics.get("train_runtime"),
        "loss_curve": curve,
        "final_loss": curve[-1]["loss"] if curve else None,
        **memory.summary(),
        **throughput.summary(),
        **collections.summary(),
        "num_hosts": len({rank["host"] for rank in throughput.ranks}) or None,
        "ranks": [
            {**progress, **pauses, **readings}
            for progress, pauses, readings in zip(
                throughput.ranks, collections.ranks, memory.per_rank(), strict=True
            )
        ],
    }


def evaluation_fields(metrics: dict[str, float], prefix: str) -> dict[str, Any]:
    """The token-weighted loss (finetune/evaluation.py), not the Trainer's mean of batch means."""
    return {
        f"{prefix}_loss": metrics.get(f"{prefix}_token_loss"),
        f"{prefix}_perplexity": metrics.get(f"{prefix}_perplexity"),
        f"{prefix}_tokens": metrics.get(f"{prefix}_tokens"),
        f"{prefix}_runtime_s": metrics.get(f"{prefix}_runtime"),
    }
