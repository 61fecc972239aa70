"""Examples packed into blocks that they cannot see across: position ids restart at each example.

transformers 5 reads the restarts: with `position_ids` and no attention mask, masking_utils'
`find_packed_sequence_indices` numbers the examples of a row and `create_causal_mask` lets a token
attend only within its own example (sdpa, eager and flex attention; flash attention turns the same
position ids into varlen boundaries). So each example's loss packed equals its loss alone. It does
so only without a KV cache, and models whose config says use_cache (GPT-2's does) build one even in
training, where the restarts are then ignored and examples attend across: `packed_collator` asks
for no cache in every packed batch.

Blocks are all `block_size` long (the tail of a block that no example fits is padding with labels
IGNORE_INDEX and its own position ids), which keeps shapes static for torch.compile and the sharded
profiles. transformers' DataCollatorWithFlattening instead concatenates a whole micro batch into one
row of varying length; TRL's `pack_dataset(strategy="bfd")` packs like this module but TRL is not a
dependency, so the best-fit-decreasing packing here is hand-written.
"""

from __future__ import annotations

import bisect
from typing import Any

import pyarrow.compute as pc
import torch
import transformers.masking_utils
from datasets import Dataset
from transformers import default_data_collator

from finetune.data_formats import IGNORE_INDEX


def truncate(examples: Dataset, block_size: int) -> tuple[Dataset, int]:
    """Examples cut to block_size tokens (their start kept), and how many were longer."""
    lengths = pc.list_value_length(examples.with_format("arrow")["input_ids"])
    too_long = pc.sum(pc.greater(lengths, block_size)).as_py() or 0
    if not too_long:
        return examples, 0

    def cut(batch: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
        return {name: [values[:block_size] for values in column] for name, column in batch.items()}

    return examples.map(cut, batched=True, desc=f"truncate to {block_size} tokens"), too_long


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of the examples in each block: longest first, each into the fullest block it fits."""
    blocks: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, block), sorted
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        at = bisect.bisect_left(room, (lengths[index], -1))
        if at == len(room):
            blocks.append([index])
            free, block = capacity - lengths[index], len(blocks) - 1
        else:
            free, block = room.pop(at)
            blocks[block].append(index)
            free -= lengths[index]
        if free > 0:
            bisect.insort(room, (free, block))
    return blocks


def pack_examples(examples: Dataset, block_size: int, pad_token_id: int) -> tuple[Dataset, list[int]]:
    """Blocks of input_ids, labels and position_ids, and the real (non-padding) tokens of each block.
    Examples must be at most block_size long."""
    rows = examples.with_format("arrow")
    all_ids = rows["input_ids"].to_pylist()
    all_labels = rows["labels"].to_pylist()
    lengths = [len(ids) for ids in all_ids]
    out: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "position_ids": []}
    real: list[int] = []
    for members in best_fit_decreasing(lengths, block_size):
        ids, labels, positions = [], [], []
        for index in members:
            ids += all_ids[index]
            labels += all_labels[index]
            positions += range(lengths[index])
        padding = block_size - len(ids)
        real.append(len(ids))
        out["input_ids"].append(ids + [pad_token_id] * padding)
        out["labels"].append(labels + [IGNORE_INDEX] * padding)
        out["position_ids"].append(positions + list(range(padding)))
    return Dataset.from_dict(out), real


def packed_collator(features: list[dict[str, Any]]) -> dict[str, Any]:
    """Packed blocks stacked as they are, with use_cache=False so the model reads the position-id
    restarts (see the module docstring)."""
    return {**default_data_collator(features), "use_cache": False}


def example_numbers(position_ids: torch.Tensor) -> torch.Tensor:
    """Each token's example within its row, counted from 0 at every restart of the position ids:
    transformers' `find_packed_sequence_indices` without its closing check (see
    `number_examples_without_reading_back`)."""
    first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)


def one_example_a_row(position_ids: torch.Tensor) -> None:
    """Rows whose positions never restart: transformers' answer for them, None, without looking."""
    return None


def number_examples_without_reading_back(packed_examples: bool) -> None:
    """Every forward without an attention mask, transformers numbers the examples of each row from the
    position ids and then asks whether any row holds more than one (`.all()` on the device's answer):
    a host sync a forward, which keeps the host from queueing ahead of the GPU. The run knows the
    answer before it starts: packed instruction examples restart their positions in nearly every row,
    and text blocks (or the arange the model makes itself) never do. So this process's masks take
    that answer without reading it back: packed runs always mask within examples (a row of one example
    gets the same causal mask, built instead of left to sdpa's is_causal), others never. Written by
    hand: transformers has no switch for the check; it looks the function up by name at each call,
    which is what this replaces."""
    masking = transformers.masking_utils
    masking.find_packed_sequence_indices = example_numbers if packed_examples else one_example_a_row
