"""Checkpoint files read without running code of the file's choosing, and refused in one line.

Two readers of a checkpoint unpickle:

- `torch.load`, used by the Trainer, DeepSpeed and accelerate for optimizer, scheduler, RNG and
  ZeRO partition files. `finetune.checkpoint.load_weights_only` makes every call weights-only; a
  refused file then raises a many-line `UnpicklingError` from deep inside training. `install`
  wraps `torch.load` so that refusal becomes one `FinetuneError` naming the file.
- `torch.distributed.checkpoint.FileSystemReader.read_metadata`, which reads an FSDP checkpoint's
  `pytorch_model_fsdp_0/.metadata` and `optimizer_0/.metadata` with plain `pickle.load`, outside
  `torch.load` and so outside `TORCH_FORCE_WEIGHTS_ONLY_LOAD`: a crafted file ran code on
  `--resume` and on `finetune export`. `install` makes every `FileSystemReader` (the ones the
  Trainer, accelerate's FSDP loading and `merge_fsdp_weights` build) read it with
  `MetadataUnpickler`.

`MetadataUnpickler` is written by hand because no library offers a restricted reader for this
file: torch's weights-only unpickler is private and reads only `torch.save`'s formats, and DCP
has no option for it. It builds only the classes DCP writes into the metadata (listed from real
FSDP2 checkpoints of model and optimizer: `pickletools` over their `.metadata` files; Python 3.13
pickles paths from `pathlib._local`).
"""

from __future__ import annotations

import functools
import os
import pickle
import re
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from finetune.errors import FinetuneError

DCP_METADATA_CLASSES = frozenset(
    {
        *(
            (module, name)
            for module in ("pathlib", "pathlib._local")
            for name in ("PosixPath", "WindowsPath")
        ),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        *(
            ("torch.distributed.checkpoint.metadata", name)
            for name in (
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "Metadata",
                "MetadataIndex",
                "StorageMeta",
                "TensorProperties",
                "TensorStorageMetadata",
                "_MEM_FORMAT_ENCODING",
            )
        ),
    }
)


class UnsafeCheckpointFile(FinetuneError, pickle.UnpicklingError):
    """A checkpoint file that would need code or objects of its own choosing to be read.

    Also an `UnpicklingError`, so a library that handles a refused file still sees the type it expects.
    """


class MetadataUnpickler(pickle.Unpickler):
    """Builds distributed-checkpoint metadata and nothing else: any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in DCP_METADATA_CLASSES or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not among the classes checkpoint metadata holds")


def load_metadata(stream: IO[bytes], path: str | os.PathLike[str]) -> Metadata:
    try:
        metadata = MetadataUnpickler(stream).load()
    except (pickle.UnpicklingError, EOFError) as error:
        raise UnsafeCheckpointFile(f"{path}: refusing to read it: {error or 'it ends early'}") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointFile(f"{path}: holds a {type(metadata).__name__}, not checkpoint metadata")
    return metadata


def check_metadata_files(checkpoint: Path) -> None:
    """Read every DCP metadata file of a checkpoint before anything else does.

    DCP reports a failed metadata read as an AssertionError with a traceback per rank (it gathers
    the error across ranks), so a refused file is caught here first, as one error before data and
    model are built. The files are small indexes of the shards.
    """
    for path in sorted(checkpoint.rglob("*.metadata")):
        with path.open("rb") as stream:
            load_metadata(stream, path)


def read_metadata(self: FileSystemReader, *args: Any, **kwargs: Any) -> Metadata:
    """`FileSystemReader.read_metadata` with the restricted unpickler in place of `pickle.load`."""
    path = self._get_metadata_path(kwargs.get("rank"))
    with self.fs.create_stream(path, "rb") as stream:
        metadata = load_metadata(stream, path)
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = self.load_id
    return metadata


def refusal_reason(error: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler refused, from its message (the rest of it is advice)."""
    found = re.search(r"GLOBAL (\S+)", str(error))
    if found:
        return f"it would call or build {found.group(1)}, which plain weights never need"
    return "it holds objects a weights-only load does not build"


def naming_refused_files(load: Any) -> Any:
    @functools.wraps(load)
    def load_or_refuse(f: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return load(f, *args, **kwargs)
        except UnsafeCheckpointFile:
            raise
        except pickle.UnpicklingError as error:
            name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "a checkpoint file")
            raise UnsafeCheckpointFile(
                f"{Path(name)}: refusing to load it: {refusal_reason(error)}"
            ) from None

    load_or_refuse.names_refused_files = True
    return load_or_refuse


def install() -> None:
    """Every DCP metadata read restricted, every refused torch.load one FinetuneError. Idempotent."""
    FileSystemReader.read_metadata = read_metadata
    if not getattr(torch.load, "names_refused_files", False):
        torch.load = naming_refused_files(torch.load)
