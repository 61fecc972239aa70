"""Sequence parallelism: each sample's tokens split over a group of processes (`--sequence_parallel N`).

The mechanism is DeepSpeed's Ulysses (Arctic Long Sequence Training) as accelerate 1.15 and
transformers 5.17 wire it: accelerate's `ParallelismConfig(sp_backend="deepspeed")` makes the
groups, its data loader adapter gathers the group's batches and gives every rank its slice of each,
with the labels shifted before the split (`shift_labels`), and transformers'
`deepspeed_sp_compute_loss` weighs each rank's loss by its trained tokens. What is here is what
those leave to the caller: the run's configuration, the checks a model and a batch must pass
before anything loads (Ulysses raises them mid-training otherwise), and position ids on every batch,
which Ulysses needs to put the tokens back in order after the split; and a resumed run's skip
over the batches its checkpoint already trained, which the adapter lacks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from finetune.data_formats import IGNORE_INDEX
from finetune.errors import FinetuneError

# Ulysses' attention over the whole sequence, after its all-to-all; the one the CPU tests run too.
ATTENTION = "sdpa"


def parallelism_config(degree: int) -> Any:
    """accelerate's ParallelismConfig for a Ulysses group of `degree` processes, for
    TrainingArguments.parallelism_config; batches may change length (instruction data)."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    return ParallelismConfig(
        sp_backend="deepspeed",
        sp_size=degree,
        sp_handler=DeepSpeedSequenceParallelConfig(
            sp_seq_length_is_variable=True, sp_attn_implementation=ATTENTION
        ),
    )


def check_strategy(strategy: Any, degree: int) -> None:
    """Ulysses partitions the model's states with ZeRO-3: any other profile is refused in one line,
    by `finetune run` before it launches and by every rank of a bare `accelerate launch`."""
    if degree > 1 and not strategy.splits_sequences:
        raise FinetuneError(
            f"--sequence_parallel is for the zero3 profiles (DeepSpeed Ulysses); profile "
            f"{strategy.name} ({strategy.kind}) trains every sample on one process"
        )


def check_heads(config: Any, degree: int) -> None:
    """Ulysses gives each rank whole attention heads: the heads must divide over the group, and the
    key/value heads of a grouped-query model divide over it or it over them (copied then)."""
    heads = getattr(config, "num_attention_heads", None)
    if heads is None:
        raise FinetuneError(
            f"--sequence_parallel {degree}: {type(config).__name__} names no num_attention_heads to split"
        )
    if heads % degree:
        raise FinetuneError(
            f"--sequence_parallel {degree} does not divide the model's {heads} attention heads: each rank "
            "takes whole heads; choose a degree that divides them"
        )
    kv_heads = getattr(config, "num_key_value_heads", None)
    if kv_heads is None:  # DeepSpeed's Ulysses reads it: GPT-2's config raised AttributeError mid-launch
        raise FinetuneError(
            f"--sequence_parallel {degree}: DeepSpeed Ulysses splits models whose config names "
            f"num_key_value_heads (Llama-style); {type(config).__name__} does not"
        )
    if kv_heads % degree and degree % kv_heads:
        raise FinetuneError(
            f"--sequence_parallel {degree} and the model's {kv_heads} key/value heads: one must divide "
            "the other"
        )


def with_position_ids(collate: Callable[[list[dict[str, Any]]], dict[str, Any]], degree: int) -> Callable:
    """`collate`, its batches also carrying each token's position and padded at the end to a length
    the group divides. Ulysses splits the sequence and gathers it back inside attention by these
    positions (packed blocks bring their own, restarting at each example); the padding is masked out
    of attention and of the loss, and a causal model's real tokens never look at it."""

    def collate_with_positions(features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate(features)
        rows, length = batch["input_ids"].shape
        if "position_ids" not in batch:
            batch["position_ids"] = torch.arange(length).expand(rows, length).clone()
        missing = -length % degree
        if missing:
            fill = {"labels": IGNORE_INDEX, "attention_mask": 0, "input_ids": 0}
            for key, value in fill.items():
                if key in batch:
                    batch[key] = torch.nn.functional.pad(batch[key], (0, missing), value=value)
            last = batch["position_ids"][:, -1:]
            batch["position_ids"] = torch.cat([batch["position_ids"], last + torch.arange(1, missing + 1)], 1)
        return batch

    return collate_with_positions


def follow_epochs(adapter: Any) -> Any:
    """Give DeepSpeed's adapter the `set_epoch` the Trainer calls on a data loader each epoch,
    passed to the loader underneath: the adapter has none, and its loader otherwise numbers the
    epochs by the passes it made itself, which a resumed run's fresh loader has not made (its
    shuffle order would be epoch 0's). Returns the adapter."""
    if not hasattr(adapter, "set_epoch"):
        adapter.set_epoch = adapter.dl.set_epoch
    return adapter


def skip_trained_batches(adapter: Any, trained: int, skip: Callable[[Any, int], Any]) -> Any:
    """A new Ulysses adapter that starts `trained` batches into the epoch, as `skip` (accelerate's
    skip_first_batches) starts a plain data loader.

    Written by hand: the Trainer skips a resumed epoch's trained batches with skip_first_batches,
    which rebuilds a torch DataLoader from the loader's dataset and sampler; the adapter has
    neither. The group's ranks take turns: one turn draws one batch from every rank's own loader
    and yields `degree` batches, each rank's slice of one of them. So the loader underneath skips
    whole turns, and the new adapter draws what was trained of the current turn and drops it (a
    collective: every rank of the group does the same)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    turns, into_turn = divmod(trained, adapter.sp_world_size)
    skipped = UlyssesSPDataLoaderAdapter(
        skip(adapter.dl, turns),
        sp_rank=adapter.sp_rank,
        sp_group=adapter.sp_group,
        sp_world_size=adapter.sp_world_size,
        device=adapter.device,
    )
    for _ in range(into_turn):
        next(skipped)
    return follow_epochs(skipped)


@contextmanager
def skipping_split_batches() -> Iterator[None]:
    """While the Trainer runs an epoch, its skip over a resumed epoch's trained batches also skips
    a Ulysses adapter's (`skip_trained_batches`); any other loader goes to accelerate's as before.
    The Trainer calls the function by its module's name, so that name is swapped, and restored."""
    import transformers.trainer as trainer_module
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    original = trainer_module.skip_first_batches

    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if isinstance(dataloader, UlyssesSPDataLoaderAdapter):
            return skip_trained_batches(dataloader, num_batches, original)
        return original(dataloader, num_batches)

    trainer_module.skip_first_batches = skip_first_batches
    try:
        yield
    finally:
        trainer_module.skip_first_batches = original
