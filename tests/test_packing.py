"""Packing instruction examples into blocks that they cannot attend across."""

import pytest
import torch
import torch.nn.functional as F
import transformers.masking_utils
from datasets import Dataset
from tiny_configs import tiny_config
from transformers import AutoModelForCausalLM

from finetune.converters import without_padding_check
from finetune.data_formats import IGNORE_INDEX
from finetune.packing import (
    best_fit_decreasing,
    example_numbers,
    number_examples_without_reading_back,
    pack_examples,
    packed_collator,
    truncate,
)

PAD = 0


def examples(lengths):
    """Examples of the given lengths: distinct token ids, the first half of each a masked prompt."""
    rows = {"input_ids": [], "labels": []}
    for number, length in enumerate(lengths):
        ids = [(number * 97 + position * 13) % 1000 + 1 for position in range(length)]
        rows["input_ids"].append(ids)
        rows["labels"].append([IGNORE_INDEX] * (length // 2) + ids[length // 2 :])
    return Dataset.from_dict(rows)


def test_best_fit_decreasing_puts_each_example_in_the_fullest_block_it_fits():
    assert best_fit_decreasing([6, 5, 4, 3, 2], 10) == [[0, 2], [1, 3, 4]]


def test_every_block_is_block_size_long_and_holds_every_example_once():
    lengths = [7, 3, 12, 5, 9, 1, 4]
    blocks, real = pack_examples(examples(lengths), 16, PAD)
    assert {len(ids) for ids in blocks["input_ids"]} == {16}
    assert sum(real) == sum(lengths)
    assert sorted(token for ids in blocks["input_ids"] for token in ids if token != PAD) == sorted(
        token for ids in examples(lengths)["input_ids"] for token in ids
    )


def test_position_ids_restart_at_each_example_and_at_the_padding():
    blocks, _ = pack_examples(examples([3, 2]), 8, PAD)
    assert blocks[0]["position_ids"] == [0, 1, 2, 0, 1, 0, 1, 2]


def test_padding_is_not_trained_on():
    blocks, real = pack_examples(examples([3, 2]), 8, PAD)
    assert real == [5]
    assert blocks[0]["labels"][5:] == [IGNORE_INDEX] * 3


def test_over_long_examples_are_cut_to_block_size_and_counted():
    cut, count = truncate(examples([20, 4, 17]), 16)
    assert count == 2
    assert [len(ids) for ids in cut["input_ids"]] == [16, 4, 16]
    assert [len(labels) for labels in cut["labels"]] == [16, 4, 16]


@pytest.fixture(params=["transformers' check", "known without reading back"])
def example_numbering(request):
    """Packed batches' masks as transformers numbers the examples (what conftest gives every test),
    and as run.py has them numbered."""
    if request.param != "transformers' check":
        number_examples_without_reading_back(packed_examples=True)


@pytest.fixture
def read_backs(monkeypatch) -> list[str]:
    """Each tensor value a forward reads back to the host (on a GPU, each waits for the device)."""
    reads: list[str] = []
    for name in ("__bool__", "item", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(tensor, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def text_model(architecture: str):
    """A tiny model as the Trainer runs it: no KV cache (`TrainingArguments.use_cache`), and as run.py
    converts it, without transformers' padding check (its own read-backs, tests/test_converters.py)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(architecture, vocab_size=1024)).eval()
    model.config.use_cache = False
    return without_padding_check(model, None, None, None, "fp32")[0]


@pytest.mark.parametrize(
    "architecture, attention",
    # transformers has no flex attention for GPT-2 (it refuses to load it so)
    [
        ("gpt2", "sdpa"),
        ("gpt2", "eager"),
        ("llama", "sdpa"),
        ("llama", "eager"),
        pytest.param("llama", "flex_attention", marks=pytest.mark.integration),
    ],  # compiles flex: slow
)
def test_each_examples_loss_packed_equals_its_loss_alone(architecture, attention, example_numbering):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_config(architecture, vocab_size=1024), attn_implementation=attention
    ).eval()
    lengths = [9, 5, 14, 7, 3]
    data = examples(lengths)
    blocks, _ = pack_examples(data, 32, PAD)
    batch = packed_collator([{key: row[key] for key in ("input_ids", "position_ids")} for row in blocks])
    with torch.no_grad():
        logits = model(**batch).logits
    seen = 0
    for row, ids_row in enumerate(blocks["input_ids"]):
        start = 0
        positions = blocks[row]["position_ids"]
        for end in [*[i for i in range(1, 32) if positions[i] == 0], 32]:
            ids = ids_row[start:end]
            match = [n for n, candidate in enumerate(data["input_ids"]) if candidate == ids]
            if match:
                labels = torch.tensor(data[match[0]]["labels"])
                packed_loss = F.cross_entropy(
                    logits[row, start : end - 1], labels[1:], ignore_index=IGNORE_INDEX
                )
                with torch.no_grad():
                    alone = model(input_ids=torch.tensor([ids]), labels=labels[None]).loss
                torch.testing.assert_close(packed_loss, alone, rtol=1e-5, atol=1e-5)
                seen += 1
            start = end
    assert seen == len(lengths)


def test_without_restarting_positions_the_examples_would_see_each_other():
    """The check above can fail: the same block read as one sequence gives other losses."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt2", vocab_size=1024)).eval()
    blocks, _ = pack_examples(examples([9, 5]), 16, PAD)
    ids = torch.tensor(blocks["input_ids"])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=torch.tensor(blocks["position_ids"])).logits
        one_sequence = model(input_ids=ids).logits
    assert not torch.allclose(packed[0, 9:14], one_sequence[0, 9:14], atol=1e-3)


def test_example_numbers_are_transformers_numbering_of_a_packed_row():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 0, 1, 2, 3, 0, 1]])
    expected = transformers.masking_utils.find_packed_sequence_indices(positions)
    assert torch.equal(example_numbers(positions), expected)


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_transformers_reads_back_whether_a_text_block_holds_several_examples(architecture, read_backs):
    """The check below can fail: unchanged, a forward of text blocks waits on the device once."""
    model = text_model(architecture)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 1024, (2, 16)))
    assert read_backs == ["__bool__"]


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_a_forward_of_text_blocks_reads_nothing_back_once_the_run_knows_it_packs_no_examples(
    architecture, read_backs
):
    model = text_model(architecture)
    ids = torch.randint(0, 1024, (2, 16))
    with torch.no_grad():
        checked = model(input_ids=ids, labels=ids).loss
        read_backs.clear()
        number_examples_without_reading_back(packed_examples=False)
        known = model(input_ids=ids, labels=ids).loss
    assert read_backs == []
    assert torch.equal(known, checked)


def test_a_forward_of_packed_blocks_reads_nothing_back_once_the_run_knows_it_packs_examples(read_backs):
    model = text_model("llama")
    blocks, _ = pack_examples(examples([9, 5, 14]), 16, PAD)
    batch = packed_collator([{key: row[key] for key in ("input_ids", "position_ids")} for row in blocks])
    number_examples_without_reading_back(packed_examples=True)
    with torch.no_grad():
        model(**batch)
    assert read_backs == []
