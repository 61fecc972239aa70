"""Trainer callbacks that record what each rank did, for the run summary."""

from __future__ import annotations

import socket
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


def gather_from_ranks(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (a one-item list when not distributed). Collective."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


class RankProgressCallback(TrainerCallback):
    """Counts the optimizer steps each rank took, so a summary can show that every rank trained."""

    def __init__(self) -> None:
        self.steps = 0
        self.ranks: list[dict[str, Any]] = []

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.steps += 1

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        local = {"rank": args.process_index, "host": socket.gethostname(), "steps": self.steps}
        self.ranks = gather_from_ranks(local)
