"""--sequence_parallel: where it is refused, what it configures, and the batches it needs (one process;
the 2-rank runs that check its losses against unsplit ones are in test_sequence_parallel_runs.py)."""

from types import SimpleNamespace

import pytest
import torch
from tiny_configs import tiny_config
from transformers import default_data_collator
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from finetune.arguments import parse_arguments
from finetune.errors import FinetuneError
from finetune.launch_settings import resolve_launch_settings
from finetune.launched import Launch
from finetune.layout import ParallelLayout
from finetune.models import on_meta_device
from finetune.packing import packed_collator
from finetune.profiles import load_strategy
from finetune.resume import run_differences
from finetune.sequence_parallel import (
    attend_within_packed_examples,
    check_data,
    check_device,
    check_heads,
    check_model,
    collate_for_split,
    equal_batch_length,
    follow_epochs,
    padding_multiple,
    with_position_ids,
)
from finetune.throughput import trained_tokens_in


def sequence_parallel_launch(profile: str, processes: int = 2, degree: int = 2) -> Launch:
    return Launch(load_strategy(profile), ParallelLayout(processes, degree))


def test_a_zero3_run_gets_a_ulysses_group_of_the_degree(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--sequence_parallel", "2"])
    resolve_launch_settings(training_args, sequence_parallel_launch("zero3"))
    config = training_args.parallelism_config
    assert (config.sp_backend, config.sp_size, config.sp_handler.sp_seq_length_is_variable) == (
        "deepspeed",
        2,
        True,
    )


@pytest.mark.parametrize("profile", ["ddp", "zero1", "zero2"])
def test_sequence_parallel_outside_zero3_and_fsdp_is_refused_in_one_line(profile, output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--sequence_parallel", "2"])
    with pytest.raises(
        FinetuneError, match=rf"^--sequence_parallel is for the zero3 profiles .*profile {profile} "
    ):
        resolve_launch_settings(training_args, sequence_parallel_launch(profile))


SPLITS = [("zero3", "ulysses"), ("zero3_offload", "ulysses"), ("fsdp", "ring"), ("fsdp_grad_op", "ring"),
          ("ddp", None)]  # fmt: skip


@pytest.mark.parametrize(("profile", "split"), SPLITS)
def test_zero3_splits_sequences_with_ulysses_and_fsdp2_with_ring_attention(profile, split):
    assert load_strategy(profile).sequence_split == split


def test_an_fsdp_run_on_gpus_gets_a_context_parallel_group_beside_its_sharding(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--sequence_parallel", "2"])
    launch = Launch(load_strategy("fsdp"), ParallelLayout(4, 2), on_gpu=True)
    resolve_launch_settings(training_args, launch)
    config = training_args.parallelism_config
    assert (config.cp_backend, config.cp_size, config.dp_shard_size, config.sp_size) == ("torch", 2, 2, 1)


def test_ring_attention_on_cpu_is_refused_in_one_line(output_flags):
    """torch's ring attention dispatches CUDA's attention kernels only."""
    _, _, training_args = parse_arguments([*output_flags, "--sequence_parallel", "2"])
    with pytest.raises(FinetuneError, match=r"^--sequence_parallel 2 under an fsdp profile .*CUDA GPUs only"):
        resolve_launch_settings(training_args, sequence_parallel_launch("fsdp"))


def test_ulysses_on_cpu_is_not_refused_for_its_device():
    check_device("ulysses", 2, on_gpu=False)


def test_ring_attention_refuses_an_attention_kernel_other_than_sdpa():
    config = tiny_config("llama")
    with pytest.raises(FinetuneError, match=r"ring attention on sdpa only; --attn_implementation is eager$"):
        check_model(None, config, 2, "ring", "eager")


def test_ring_attention_refuses_a_model_without_self_attn_modules(tmp_path):
    """accelerate makes modules named self_attn causal across the ring; GPT-2's are named attn."""
    config = tiny_config("gpt2")
    meta_model = on_meta_device(config, "sdpa")
    with pytest.raises(FinetuneError, match=r"modules named self_attn .*GPT2Config has none"):
        check_model(meta_model, config, 2, "ring", "sdpa")


def test_ring_attention_takes_a_llama_model_whatever_its_heads():
    """Ring attention splits the sequence, not the heads: 2 heads over a group of 4 are fine."""
    config = tiny_config("llama", num_attention_heads=2)
    check_model(on_meta_device(config, "sdpa"), config, 4, "ring", "sdpa")


def test_ring_attention_refuses_sliding_window_layers():
    config = tiny_config("llama")
    config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(FinetuneError, match=r"attend within a window; use a zero3 profile$"):
        check_model(None, config, 2, "ring", "sdpa")


def test_ring_attention_refuses_packed_instruction_examples_and_takes_unpacked_ones():
    with pytest.raises(FinetuneError, match=r"let packed examples attend to each other; use --no_packing"):
        check_data("ring", 2, packed_examples=True)
    check_data("ring", 2, packed_examples=False)
    check_data("ring", 1, packed_examples=True)


def test_ulysses_takes_packed_instruction_examples():
    check_data("ulysses", 2, packed_examples=True)


@pytest.fixture
def restored_sdpa(monkeypatch):
    """transformers' sdpa entry, put back after the test (`attend_within_packed_examples` replaces it)."""
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"])
    return ALL_ATTENTION_FUNCTIONS["sdpa"]


def attention_as_installed(query, key, value, positions):
    """transformers' sdpa entry as a layer calls it under Ulysses: no mask, the gathered positions."""
    module = SimpleNamespace(is_causal=True, training=False, num_key_value_groups=1)
    output, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, None, position_ids=positions)
    return output


def test_ulysses_attention_over_packed_examples_equals_each_example_attended_alone(restored_sdpa):
    """Given no mask (DeepSpeed drops it) and positions that restart, sdpa attends within each example."""
    attend_within_packed_examples("ulysses", 2, packed_examples=True)
    lengths = [3, 4, 2]
    query, key, value = (torch.randn(1, 2, sum(lengths), 8) for _ in range(3))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    packed = attention_as_installed(query, key, value, positions)
    alone = [
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        for q, k, v in zip(*(x.split(lengths, dim=2) for x in (query, key, value)), strict=True)
    ]
    torch.testing.assert_close(packed, torch.cat(alone, dim=1))


def test_ulysses_attention_over_one_example_a_row_stays_causal(restored_sdpa):
    attend_within_packed_examples("ulysses", 2, packed_examples=True)
    query, key, value = (torch.randn(2, 2, 6, 8) for _ in range(3))
    positions = torch.arange(6).expand(2, 6)
    output = attention_as_installed(query, key, value, positions)
    causal = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    torch.testing.assert_close(output, causal.transpose(1, 2))


@pytest.mark.parametrize(
    ("split", "degree", "packed"),
    [("ulysses", 2, False), ("ulysses", 1, True), ("ring", 2, True), (None, 1, True)],
)
def test_attention_is_left_as_transformers_has_it_unless_ulysses_splits_packed_examples(
    restored_sdpa, split, degree, packed
):
    attend_within_packed_examples(split, degree, packed)
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is restored_sdpa


def test_ring_batches_are_padded_to_two_chunks_a_rank_of_32_tokens_each_and_ulysses_to_one_slice():
    assert (padding_multiple("ring", 2), padding_multiple("ulysses", 2)) == (128, 2)


def test_a_degree_below_one_is_refused(output_flags):
    with pytest.raises(FinetuneError, match=r"^--sequence_parallel must be at least 1, got 0$"):
        parse_arguments([*output_flags, "--sequence_parallel", "0"])


def test_a_degree_that_does_not_divide_the_heads_is_refused_in_one_line():
    with pytest.raises(
        FinetuneError, match="--sequence_parallel 4 does not divide the model's 2 attention heads"
    ):
        check_heads(tiny_config("llama", num_attention_heads=2), 4)


def test_a_model_without_key_value_heads_in_its_config_is_refused_in_one_line():
    """DeepSpeed's Ulysses reads num_key_value_heads: GPT-2's config has none."""
    with pytest.raises(FinetuneError, match=r"names num_key_value_heads .*GPT2Config does not"):
        check_heads(tiny_config("gpt2"), 2)


def test_grouped_key_value_heads_may_be_fewer_than_the_degree_when_it_divides_them():
    check_heads(tiny_config("llama", num_attention_heads=4, num_key_value_heads=1), 2)
    with pytest.raises(FinetuneError, match="model's 3 key/value heads"):
        check_heads(tiny_config("llama", hidden_size=48, num_attention_heads=12, num_key_value_heads=3), 2)


def text_features(rows: int, length: int) -> list[dict[str, list[int]]]:
    return [{"input_ids": [7] * length, "attention_mask": [1] * length, "labels": [7] * length}] * rows


def test_text_batches_carry_each_rows_positions():
    batch = with_position_ids(default_data_collator, 2)(text_features(rows=2, length=6))
    assert batch["position_ids"].tolist() == [list(range(6))] * 2


def test_a_batch_is_padded_to_a_length_the_group_divides_and_nothing_is_trained_on_the_padding():
    batch = with_position_ids(default_data_collator, 4)(text_features(rows=1, length=6))
    assert batch["input_ids"].shape == (1, 8)
    assert batch["labels"][0, 6:].tolist() == [-100, -100]
    assert batch["attention_mask"][0].tolist() == [1] * 6 + [0, 0]
    assert batch["position_ids"][0].tolist() == list(range(8))


def test_on_cpu_every_ulysses_batch_is_padded_to_the_block_size_where_gloo_needs_one_length():
    batch = with_position_ids(default_data_collator, 4, equal_batch_length("ulysses", False, 10))(
        text_features(rows=1, length=6)
    )
    assert batch["input_ids"].shape == (1, 12)  # the block, then a length the group divides
    assert batch["labels"][0, 6:].tolist() == [-100] * 6
    assert batch["position_ids"][0].tolist() == list(range(12))
    assert equal_batch_length("ulysses", True, 10) == equal_batch_length("ring", False, 10) == 0


def test_a_run_without_sequence_parallelism_keeps_its_own_collator():
    unsplit = collate_for_split(default_data_collator, None, 1, on_gpu=False, block_size=10)
    assert unsplit is default_data_collator


def test_a_split_run_collates_with_positions_padded_as_its_split_needs():
    ulysses_on_cpu = collate_for_split(default_data_collator, "ulysses", 4, on_gpu=False, block_size=10)
    assert ulysses_on_cpu(text_features(rows=1, length=6))["input_ids"].shape == (1, 12)
    ring = collate_for_split(default_data_collator, "ring", 2, on_gpu=True, block_size=10)
    batch = ring(text_features(rows=1, length=6))
    assert batch["input_ids"].shape == (1, padding_multiple("ring", 2))
    assert batch["position_ids"][0].tolist() == list(range(padding_multiple("ring", 2)))


def test_packed_blocks_keep_their_own_position_restarts():
    block = {"input_ids": [5] * 6, "labels": [5] * 6, "position_ids": [0, 1, 2, 0, 1, 2]}
    batch = with_position_ids(packed_collator, 2)([block])
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 2]


def test_a_ranks_slice_counts_every_shifted_label_it_trains_on():
    """Ulysses shifts the labels before it splits them: each slice's first label is a trained one."""
    shifted = torch.tensor([[7, 7, -100, 7]])
    assert int(trained_tokens_in({"labels": shifted, "shift_labels": shifted})) == 3


def identity(degree: int | None) -> dict:
    entry = {"strategy": "zero3", "world_size": 2, "micro_batch_size": 2, "gradient_accumulation_steps": 1}
    return {**entry, "flags": {}, **({} if degree is None else {"sequence_parallel_size": degree})}


def test_resuming_with_another_degree_is_another_run():
    """At one world size the degree sets the data-parallel ranks, so the global batch."""
    assert [d.field for d in run_differences(identity(2), identity(1))] == ["sequence_parallel_size"]


def test_a_checkpoint_from_before_sequence_parallelism_resumes_unsplit():
    assert run_differences(identity(None), identity(1)) == []


def test_the_ulysses_loader_passes_each_epoch_to_the_loader_underneath():
    """The Trainer numbers the epochs through set_epoch; DeepSpeed's adapter has none, and a resumed
    run's fresh loader would otherwise shuffle the next epoch as epoch 0."""
    epochs = []
    adapter = SimpleNamespace(dl=SimpleNamespace(set_epoch=epochs.append))
    follow_epochs(adapter).set_epoch(3)
    assert epochs == [3]
