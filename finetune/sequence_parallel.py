"""Sequence parallelism: each sample's tokens split over a group of processes (`--sequence_parallel N`).

Two mechanisms, one per kind of profile (`Strategy.sequence_split`), both as accelerate 1.15 and
transformers 5.17 wire them. Under ZeRO-3, DeepSpeed's Ulysses (Arctic Long Sequence Training):
accelerate's `ParallelismConfig(sp_backend="deepspeed")` makes the groups, its data loader adapter
gathers the group's batches and gives every rank its slice of each, with the labels shifted before
the split (`shift_labels`), and transformers' `deepspeed_sp_compute_loss` weighs each rank's loss by
its trained tokens. Under FSDP2, torch's context parallelism (ring attention):
`ParallelismConfig(cp_size=N)`, the Trainer shards each batch's tensors along the sequence inside
`accelerator.maybe_context_parallel` and torch passes keys and values round the group inside
attention; FSDP2 shards the model over the group too.

What is here is what those leave to the caller: the run's configuration, the checks a model, a
device and the data must pass before anything loads (the libraries raise them mid-training
otherwise), position ids on every batch (Ulysses puts the tokens back in order by them; the ring
shards them with the tokens), packed examples kept apart under Ulysses, and a resumed run's skip
over the batches its checkpoint already trained, which the Ulysses adapter lacks.
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


def parallelism_config(degree: int, split: str, world_size: int) -> Any:
    """accelerate's ParallelismConfig for groups of `degree` processes splitting each sample, for
    TrainingArguments.parallelism_config. Ulysses: batches may change length (instruction data).
    Ring: FSDP2 shards the model over the data-parallel ranks and the group together."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    if split == "ring":
        return ParallelismConfig(dp_shard_size=world_size // degree, cp_size=degree, cp_backend="torch")
    return ParallelismConfig(
        sp_backend="deepspeed",
        sp_size=degree,
        sp_handler=DeepSpeedSequenceParallelConfig(
            sp_seq_length_is_variable=True, sp_attn_implementation=ATTENTION
        ),
    )


def check_strategy(strategy: Any, degree: int) -> None:
    """Only the profiles whose sharding a mechanism is built on split sequences: any other is refused
    in one line, by `finetune run` before it launches and by every rank of a bare `accelerate launch`."""
    if degree > 1 and not strategy.splits_sequences:
        raise FinetuneError(
            f"--sequence_parallel is for the zero3 profiles (DeepSpeed Ulysses) and the fsdp profiles "
            f"(torch context parallelism); profile {strategy.name} ({strategy.kind}) trains every sample "
            "on one process"
        )
    if degree > 1 and strategy.reduces_split_gradients_unevenly:  # the DeepSpeed setup.cfg allows
        raise FinetuneError(
            f"--sequence_parallel under profile {strategy.name}: its DeepSpeed JSON sets reduce_scatter "
            "false with contiguous_gradients, where DeepSpeed before 0.20.2 leaves some gradients scaled "
            "by the group size; set reduce_scatter true (DeepSpeed's default) or contiguous_gradients false"
        )


def check_device(split: str | None, degree: int, on_gpu: bool) -> None:
    """torch's ring attention has kernels for CUDA's attention backends only (flash, efficient,
    cuDNN); on CPU SDPA runs a kernel the ring does not dispatch, and the run would fail at its first
    attention."""
    if degree > 1 and split == "ring" and not on_gpu:
        raise FinetuneError(
            f"--sequence_parallel {degree} under an fsdp profile is torch's ring attention, which runs on "
            "CUDA GPUs only; on CPU use a zero3 profile (DeepSpeed Ulysses)"
        )


def check_model(meta_model: Any, config: Any, degree: int, split: str | None, attention: str) -> None:
    """What each mechanism needs of the model, checked on its config, its `--attn_implementation`
    and its modules (built on the meta device; None for remote code, checked on the config alone).
    The ring attends causally over the whole sequence, dropping the model's mask (accelerate's
    hooks): a model with sliding-window or chunked layers would train unmasked."""
    if degree == 1 or split is None:
        return
    if split == "ulysses":
        check_heads(config, degree)
        return
    if attention != ATTENTION:
        raise FinetuneError(
            f"--sequence_parallel {degree} under an fsdp profile runs ring attention on {ATTENTION} only; "
            f"--attn_implementation is {attention}"
        )
    layer_types = set(getattr(config, "layer_types", None) or [])
    if layer_types - {"full_attention"} or (not layer_types and getattr(config, "sliding_window", None)):
        raise FinetuneError(
            f"--sequence_parallel {degree} under an fsdp profile: ring attention is causal over the whole "
            f"sequence and {type(config).__name__}'s layers attend within a window; use a zero3 profile"
        )
    names = [name for name, _ in meta_model.named_modules()] if meta_model is not None else None
    if names is not None and not any(name.endswith("self_attn") for name in names):
        raise FinetuneError(
            f"--sequence_parallel {degree} under an fsdp profile: accelerate makes the attention of "
            f"modules named self_attn (Llama-style) causal across the ring; {type(config).__name__} has none "
            "(a zero3 profile splits it with Ulysses where its heads allow)"
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


def check_data(split: str | None, degree: int, packed_examples: bool) -> None:
    """Packed instruction examples are kept apart by their restarting positions (finetune/packing.py)
    only where attention reads them. One process does: transformers makes sdpa's mask block-diagonal
    from them; split by Ulysses, `attend_within_packed_examples` does. The ring's attention is plain
    causal over the whole sequence: packed examples would attend to each other, and the loss would
    not be the unsplit run's, so it is refused in one line."""
    if degree > 1 and packed_examples and split == "ring":
        raise FinetuneError(
            f"--sequence_parallel {degree}: ring attention is causal over the whole block and would let "
            "packed examples attend to each other; use --no_packing (or a zero3 profile: Ulysses keeps "
            "them apart)"
        )


def attend_within_packed_examples(split: str | None, degree: int, packed_examples: bool) -> None:
    """Under Ulysses, attention over packed examples stays within each example, as one process's does
    (elsewhere nothing changes: the ring refuses packed data in `check_data`).

    DeepSpeed's `UlyssesSPAttentionHF` drops the model's mask (built for a rank's slice, not the
    gathered sequence) and runs sdpa causal over the whole block with the gathered position ids
    beside it, which only flash attention's variable-length kernel reads: packed examples attended to
    each other (a split first loss of 5.55282 against the unsplit 5.55334, 1,024 byte-level tokens a
    block). This puts, in transformers' attention table, an sdpa that builds from those positions the
    block-diagonal causal mask transformers builds for one process (its `find_packed_sequence_indices`,
    which run.py answers without reading back: `packing.number_examples_without_reading_back`), where
    none is given and the positions restart; accelerate then hands it to DeepSpeed, which wraps it.
    Written by hand: neither library keeps packed examples apart there. The mask is dense, block²
    booleans a sample at every layer (a megabyte at 1,024 tokens, 4 GiB at 65,536; sdpa's kernels may
    make an additive copy in the compute dtype), which the planner does not count: packing is for
    instruction data's short examples."""
    if not (split == "ulysses" and degree > 1 and packed_examples):
        return
    from transformers import masking_utils
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS[ATTENTION]

    def sdpa_within_examples(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        positions = kwargs.get("position_ids")
        if attention_mask is None and positions is not None:
            examples = masking_utils.find_packed_sequence_indices(positions)  # as run.py has it answer
            if examples is not None:
                length = examples.shape[-1]
                causal = torch.ones(length, length, dtype=torch.bool, device=examples.device).tril()
                attention_mask = ((examples[:, :, None] == examples[:, None, :]) & causal)[:, None]
        return sdpa(module, query, key, value, attention_mask, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS[ATTENTION] = sdpa_within_examples


# The memory-efficient attention kernel (fp32, or where flash does not apply) pads its logsumexp to a
# multiple of 32 rows, and torch's ring merge does not trim it: a chunk of 16 tokens failed on 2 GPUs
# ("size of tensor a (32) must match ... (16)").
RING_CHUNK_MULTIPLE = 32


def padding_multiple(split: str, degree: int) -> int:
    """The length every batch is padded to a multiple of: Ulysses splits it into `degree` equal
    slices; the ring into 2 x `degree` chunks, each rank taking one from each end so that causal
    attention's work is balanced (torch's load balancer), each chunk a multiple of
    `RING_CHUNK_MULTIPLE` tokens."""
    return 2 * degree * RING_CHUNK_MULTIPLE if split == "ring" else degree


def with_position_ids(
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]], multiple: int, least_length: int = 0
) -> Callable:
    """`collate`, its batches also carrying each token's position and padded at the end to a
    `multiple` (`padding_multiple`), and to `least_length` where every batch must have one length
    (`equal_batch_length`). Ulysses splits the sequence and gathers it back inside attention by these
    positions; the ring shards them with the tokens. The padding is masked out of the loss, and a
    causal model's real tokens never look at it."""

    def collate_with_positions(features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate(features)
        rows, length = batch["input_ids"].shape
        if "position_ids" not in batch:
            batch["position_ids"] = torch.arange(length).expand(rows, length).clone()
        missing = max(least_length - length, 0)
        missing += -(length + missing) % multiple
        if missing:
            fill = {"labels": IGNORE_INDEX, "attention_mask": 0, "input_ids": 0}
            for key, value in fill.items():
                if key in batch:
                    batch[key] = torch.nn.functional.pad(batch[key], (0, missing), value=value)
            last = batch["position_ids"][:, -1:]
            batch["position_ids"] = torch.cat([batch["position_ids"], last + torch.arange(1, missing + 1)], 1)
        return batch

    return collate_with_positions


def equal_batch_length(split: str | None, on_gpu: bool, block_size: int) -> int:
    """The length every batch is padded to, or 0 where batches may differ. DeepSpeed's Ulysses data
    loader adapter all-gathers the group's batches as tensors of unequal lengths, which gloo refuses
    ("ProcessGroupGloo::allgather: invalid tensor size"): on CPU every batch is padded to the block
    size. On GPUs batches keep their own lengths, over NCCL, which the adapter is written for."""
    return block_size if split == "ulysses" and not on_gpu else 0


def collate_for_split(
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
    split: str | None,
    degree: int,
    on_gpu: bool,
    block_size: int,
) -> Callable:
    """`collate` as a run of sequence-parallel `degree` needs it (`with_position_ids`, padded as
    `padding_multiple` and `equal_batch_length` say); unchanged without sequence parallelism."""
    if degree <= 1:
        return collate
    least_length = equal_batch_length(split, on_gpu, block_size)
    return with_position_ids(collate, padding_multiple(split, degree), least_length)


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
