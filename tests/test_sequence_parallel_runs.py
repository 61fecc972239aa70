"""--sequence_parallel 2 trains exactly what one process trains unsplit: the same loss at every step
and the same weights at the end, in fp32. On 2 gloo ranks under zero3 (DeepSpeed Ulysses); on 2 CUDA
GPUs under fsdp (torch's ring attention, which has no CPU kernels: skipped without the GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from finetune.summary import read_summary

from launching import accelerate_launch as launched_with
from launching import launch
from runs import copy_checkpoint

pytestmark = pytest.mark.integration
on_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="ring attention runs on 2 CUDA GPUs")

STEPS = 4
EXACT = 1e-5  # fp32: the split only reorders sums


def flags(model: Path, *extra: str) -> list[str]:
    return [
        "--model", str(model), "--from_scratch", "--batch_size", "2", "--max_steps", str(STEPS),
        "--logging_steps", "1", "--precision", "fp32", "--torch_compile", "false", "--learning_rate", "1e-3",
        "--save_strategy", "no", "--max_eval_samples", "4", "--report_to", "none", "--disable_tqdm", "true",
        "--throughput_warmup_steps", "1", *extra,
    ]  # fmt: skip


def unsplit_and_split(model: Path, tmp_path: Path, *extra: str, profile: str = "zero3") -> tuple[Path, Path]:
    unsplit, split = tmp_path / "unsplit", tmp_path / "split"
    launch(launched_with(profile, num_processes=1), unsplit, flags(model, *extra))
    launch(launched_with(profile, num_processes=2), split, flags(model, *extra, "--sequence_parallel", "2"))
    return unsplit, split


def assert_same_training(unsplit: Path, split: Path) -> None:
    one, two = read_summary(unsplit), read_summary(split)
    assert (two["sequence_parallel_size"], two["data_parallel_size"]) == (2, 1)
    assert two["global_batch_size"] == one["global_batch_size"]
    assert [p["step"] for p in two["loss_curve"]] == list(range(1, one["steps"] + 1))
    for a, b in zip(one["loss_curve"], two["loss_curve"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=EXACT), a["step"]
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], abs=EXACT)
    weights_one, weights_two = (
        load_file(unsplit / "model.safetensors"),
        load_file(split / "model.safetensors"),
    )
    assert weights_one.keys() == weights_two.keys()
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, rtol=0, atol=EXACT, msg=name)


# Text blocks of 64 tokens, unsplit and split, 6 steps with a checkpoint at step 3: one pair of runs that
# the equality, the token count and the resume below all read (each launch costs more than its checks).
TEXT_BLOCK = 64
TEXT_STEPS, TEXT_CHECKPOINT = 6, 3
TEXT_RUN = (
    "--block_size", str(TEXT_BLOCK), "--max_steps", str(TEXT_STEPS),
    "--save_strategy", "steps", "--save_steps", str(TEXT_CHECKPOINT),
)  # fmt: skip


@pytest.fixture(scope="module")
def text_blocks(byte_llama_config_dir, tmp_path_factory) -> tuple[Path, Path]:
    return unsplit_and_split(byte_llama_config_dir, tmp_path_factory.mktemp("text"), *TEXT_RUN)


def test_text_blocks_split_over_two_ranks_train_as_one_process_does(text_blocks):
    assert_same_training(*text_blocks)


def test_padded_instruction_data_trains_as_one_process_does(byte_llama_config_dir, data_dir, tmp_path):
    """Unpacked examples of many lengths (GSM8K in bytes) padded to the batch's longest, then to a
    length the group divides; on CPU to the block size, as gloo gathers the group's batches."""
    extra = ("--dataset", str(data_dir / "gsm8k"), "--block_size", "1024", "--no_packing")
    unsplit, split = unsplit_and_split(byte_llama_config_dir, tmp_path, *extra)
    assert read_summary(split)["masked_tokens"] > 0
    assert_same_training(unsplit, split)


def assert_counted_once(split: Path, block_size: int) -> None:
    """Each rank counts the tokens of its slice: a sample is its block's tokens, summed over the group."""
    summary = read_summary(split)
    assert summary["tokens_per_second"] / summary["samples_per_second"] == pytest.approx(block_size)


def test_a_split_samples_tokens_are_counted_once_not_once_per_rank(text_blocks):
    assert_counted_once(text_blocks[1], TEXT_BLOCK)


@on_two_gpus
def test_a_ring_split_samples_tokens_are_counted_once_not_once_per_rank(byte_llama_config_dir, tmp_path):
    extra = ("--block_size", "128", "--sequence_parallel", "2")
    launch(launched_with("fsdp", num_processes=2), tmp_path, flags(byte_llama_config_dir, *extra))
    assert_counted_once(tmp_path, 128)


def test_packed_instruction_data_with_masked_prompts_trains_as_one_process_does(
    byte_llama_config_dir, data_dir, tmp_path
):
    """Packed GSM8K at 1,024 byte-level tokens a block, 2-3 examples in each: the loss is on the
    answers only and each example attends within itself (`attend_within_packed_examples`); with
    DeepSpeed's causal sdpa over the whole block the split first loss was 5.55282 against 5.55334."""
    extra = ("--dataset", str(data_dir / "gsm8k"), "--block_size", "1024")
    unsplit, split = unsplit_and_split(byte_llama_config_dir, tmp_path, *extra)
    assert read_summary(split)["masked_tokens"] > 0
    assert_same_training(unsplit, split)


def test_a_split_run_resumed_mid_turn_continues_as_the_uninterrupted_run(
    text_blocks, byte_llama_config_dir, tmp_path
):
    """Stopped after step 3: a turn of the group's two ranks is two steps, so the resumed loader skips
    one whole turn and half of the next; every later step's loss and the final weights are the
    uninterrupted run's."""
    _, run = text_blocks
    stopped = tmp_path / "stopped"
    copy_checkpoint(run, stopped, TEXT_CHECKPOINT)
    split = flags(byte_llama_config_dir, *TEXT_RUN, "--sequence_parallel", "2")
    launch(launched_with("zero3", num_processes=2), stopped, [*split, "--resume"])
    uninterrupted, resumed = read_summary(run), read_summary(stopped)
    assert resumed["resumed_from_step"] == TEXT_CHECKPOINT
    after, resumed_after = (
        [p for p in s["loss_curve"] if p["step"] > TEXT_CHECKPOINT] for s in (uninterrupted, resumed)
    )
    assert [point["step"] for point in resumed_after] == [4, 5, 6]
    for a, b in zip(after, resumed_after, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=EXACT), a["step"]
    assert resumed["eval_loss"] == pytest.approx(uninterrupted["eval_loss"], abs=EXACT)
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], abs=EXACT)
    resumed_weights = load_file(stopped / "model.safetensors")
    for name, tensor in load_file(run / "model.safetensors").items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=0, atol=EXACT, msg=name)


@on_two_gpus
def test_ring_attention_trains_text_blocks_as_one_gpu_does(tiny_llama_config_dir, tmp_path):
    """Blocks of 128 tokens: 4 chunks of 32, the least the ring's memory-efficient kernel takes unpadded."""
    unsplit, split = unsplit_and_split(tiny_llama_config_dir, tmp_path, "--block_size", "128", profile="fsdp")
    assert_same_training(unsplit, split)


@on_two_gpus
def test_ring_attention_trains_padded_instruction_data_as_one_gpu_does(
    tiny_llama_config_dir, data_dir, tmp_path
):
    """Examples padded at the end, then to 2 chunks a rank: causal attention never looks at the padding."""
    extra = ("--dataset", str(data_dir / "gsm8k"), "--block_size", "128", "--no_packing")
    unsplit, split = unsplit_and_split(tiny_llama_config_dir, tmp_path, *extra, profile="fsdp")
    assert_same_training(unsplit, split)
