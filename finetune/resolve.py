"""Offline-first name resolution shared by models and datasets.

Order: an existing local path, then `$FINETUNE_DATA_DIR/<name>`, then the Hugging Face Hub
(unless `HF_HUB_OFFLINE` is set, or the Hub does not answer a quick request). Compute nodes often
cannot reach the Hub, so the local places always win and a failure says everything that was tried.
"""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import constants as hub_constants

DATA_DIR_ENV = "FINETUNE_DATA_DIR"
HUB_PROBE_TIMEOUT_S = 3.0
LISTED_NAMES = 12


@dataclass(frozen=True)
class Resolved:
    """Where a name was found: a local folder/file, or a Hub id to download."""

    name: str
    local_path: Path | None
    hub_id: str | None
    tried: list[str] = field(default_factory=list)


def data_dir() -> Path | None:
    """The data folder as an absolute path: a relative value means the folder the command started in."""
    value = os.environ.get(DATA_DIR_ENV)
    return Path(os.path.abspath(Path(value).expanduser())) if value else None


def pin_data_dir() -> None:
    """Make `$FINETUNE_DATA_DIR` absolute in this process's environment, once, at the start.

    Launched ranks, compared runs and SLURM jobs inherit the environment but may start elsewhere
    (SLURM starts jobs in the submit directory, a launcher may change directory), where a relative
    value would name another folder or none.
    """
    root = data_dir()
    if root is not None:
        os.environ[DATA_DIR_ENV] = str(root)


def hub_offline() -> bool:
    return bool(hub_constants.HF_HUB_OFFLINE)


@functools.cache
def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached (None when it answers), from one request with a short timeout.

    huggingface_hub retries a failed connection five times with growing pauses (`http_backoff`,
    about 25 s) before it gives up, and only then would a missing local folder be reported; this
    probe, which no library offers, turns a machine without network into an answer in seconds.
    Any HTTP answer, even an error status, means the Hub is reachable. The standard library asks,
    not huggingface_hub's HTTP client: which client that is changes between its major versions.
    """
    request = urllib.request.Request(hub_constants.ENDPOINT, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as error:  # URLError, timeouts and refused connections are OSErrors
        return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def describe_data_dir(root: Path) -> str:
    """The data folder, whether it exists, and what it holds: the usual cause of a name not found."""
    if not root.is_dir():
        return f"${DATA_DIR_ENV}={root} (does not exist)"
    names = sorted(path.name for path in root.iterdir() if not path.name.startswith("."))
    listed = ", ".join(names[:LISTED_NAMES]) + (", ..." if len(names) > LISTED_NAMES else "")
    return f"${DATA_DIR_ENV}={root} (holds: {listed or 'nothing'})"


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
    elif not root.is_dir():
        tried.append(describe_data_dir(root))
    else:
        for candidate in dict.fromkeys((name, *local_names)):
            candidate_path = root / candidate
            if candidate_path == path:  # an absolute name: the data dir adds nothing to it
                continue
            if candidate_path.exists():
                return Resolved(name, candidate_path, None, tried)
            tried.append(str(candidate_path))
        tried.append(describe_data_dir(root))
    if hub_offline():
        tried.append("the Hub (skipped: HF_HUB_OFFLINE is set)")
        return Resolved(name, None, None, tried)
    reason = hub_unreachable()
    if reason is not None:
        tried.append(f"the Hub at {hub_constants.ENDPOINT} (unreachable: {reason})")
        return Resolved(name, None, None, tried)
    return Resolved(name, None, hub_id or name, tried)


def describe_tried(resolved: Resolved) -> str:
    return "looked in: " + "; ".join(resolved.tried)
