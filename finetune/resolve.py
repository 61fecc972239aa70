"""Offline-first name resolution shared by models and datasets.

Order: an existing local path, then `$FINETUNE_DATA_DIR/<name>`, then the Hugging Face Hub
(unless `HF_HUB_OFFLINE` is set). Compute nodes often cannot reach the Hub, so the local
places always win and a failure says everything that was tried.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import constants as hub_constants

DATA_DIR_ENV = "FINETUNE_DATA_DIR"


@dataclass(frozen=True)
class Resolved:
    """Where a name was found: a local folder/file, or a Hub id to download."""

    name: str
    local_path: Path | None
    hub_id: str | None
    tried: list[str] = field(default_factory=list)


def data_dir() -> Path | None:
    value = os.environ.get(DATA_DIR_ENV)
    return Path(value).expanduser() if value else None


def hub_offline() -> bool:
    return bool(hub_constants.HF_HUB_OFFLINE)


def resolve(name: str, local_names: tuple[str, ...] = (), hub_id: str | None = None) -> Resolved:
    """Find `name` locally first; `local_names` are other folder names it may have under the data dir."""
    tried = []
    path = Path(name).expanduser()
    if path.exists():
        return Resolved(name, path, None, tried)
    tried.append(f"local path {path}")
    root = data_dir()
    if root is None:
        tried.append(f"${DATA_DIR_ENV} (not set)")
    else:
        for candidate in dict.fromkeys((name, *local_names)):
            candidate_path = root / candidate
            if candidate_path.exists():
                return Resolved(name, candidate_path, None, tried)
            tried.append(str(candidate_path))
    if hub_offline():
        tried.append("the Hub (skipped: HF_HUB_OFFLINE is set)")
        return Resolved(name, None, None, tried)
    return Resolved(name, None, hub_id or name, tried)


def describe_tried(resolved: Resolved) -> str:
    return "looked in: " + "; ".join(resolved.tried)
