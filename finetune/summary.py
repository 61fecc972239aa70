"""The run summary: one JSON file per run that says what ran, on what, and what came out."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
from pathlib import Path
from typing import Any

import torch

SUMMARY_FILE = "run_summary.json"
PACKAGES = ("torch", "transformers", "accelerate", "deepspeed", "datasets")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def hardware() -> dict[str, Any]:
    if torch.cuda.is_available():
        return {"device": torch.cuda.get_device_name(), "gpus_visible": torch.cuda.device_count()}
    return {"device": "cpu", "cpu_count": os.cpu_count()}


def perplexity(loss: float) -> float:
    """exp(loss), or infinity when the loss is too large to exponentiate."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def loss_curve(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [{"step": entry["step"], "loss": entry["loss"]} for entry in log_history if "loss" in entry]


def write_summary(output_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Written atomically, so a reader never sees half a file."""
    path = Path(output_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(temporary, path)
    return path


def read_summary(output_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(output_dir) / SUMMARY_FILE).read_text())
