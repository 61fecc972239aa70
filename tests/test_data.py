"""Packing, padding, split arrangement and the end-to-end dataset build on the shared offline data."""

import itertools
import re

import pytest
from datasets import Dataset, DatasetDict, concatenate_datasets

from finetune.data import (
    IGNORE_INDEX,
    arrange_splits,
    build_datasets,
    count_label_tokens,
    pack,
    pad_and_truncate,
)
from finetune.errors import FinetuneError
from finetune.local_data import data_files
from finetune.run_flags import DataArguments

TEXTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15, 16], [17, 18]]  # 18 tokens
STREAM = list(itertools.chain.from_iterable(TEXTS))


def token_ids(rows):
    return Dataset.from_dict({"input_ids": rows})


def flatten(blocks):
    return list(itertools.chain.from_iterable(blocks))


# pack


def test_packed_blocks_all_have_block_size_tokens():
    packed = pack(token_ids(TEXTS), 4)
    assert len(packed) == 4
    assert all(len(block) == 4 for block in packed["input_ids"])


def test_packing_keeps_every_token_in_order():
    packed = pack(token_ids(TEXTS), 4)
    assert flatten(packed["input_ids"]) == STREAM[:16]


def test_packing_keeps_tokens_across_arrow_chunks():
    two_chunks = concatenate_datasets([token_ids(TEXTS[:2]), token_ids(TEXTS[2:])])
    packed = pack(two_chunks, 5)
    assert flatten(packed["input_ids"]) == STREAM[:15]


def test_packed_labels_equal_input_ids():
    packed = pack(token_ids(TEXTS), 4)
    assert packed["labels"] == packed["input_ids"]


def test_stream_shorter_than_one_block_packs_to_nothing():
    assert len(pack(token_ids(TEXTS), len(STREAM) + 1)) == 0


# pad_and_truncate

PAD = 0


def padded():
    return pad_and_truncate(token_ids([[5, 6, 7, 8, 9, 10], [11, 12], [13], [], [14, 15, 16, 17]]), 4, PAD)


def test_text_longer_than_block_is_truncated():
    assert padded()["input_ids"][0] == [5, 6, 7, 8]


def test_text_shorter_than_block_is_padded_with_pad_id():
    assert padded()["input_ids"][1] == [11, 12, PAD, PAD]


def test_labels_are_ignored_exactly_on_padding():
    assert padded()["labels"] == [[5, 6, 7, 8], [11, 12, IGNORE_INDEX, IGNORE_INDEX], [14, 15, 16, 17]]


def test_attention_mask_is_zero_exactly_on_padding():
    assert padded()["attention_mask"] == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]]


def test_texts_under_two_tokens_are_dropped():
    assert len(padded()) == 3


# arrange_splits


def texts(prefix, count):
    return Dataset.from_dict({"text": [f"{prefix} {i}" for i in range(count)]})


def test_validation_and_test_only_train_on_validation_and_evaluate_on_test():
    raw = DatasetDict({"validation": texts("valid", 6), "test": texts("test", 4)})
    splits, notes = arrange_splits(raw, 5, seed=0)
    assert splits["train"]["text"] == raw["validation"]["text"]
    assert splits["validation"]["text"] == raw["test"]["text"]
    assert any("no train split" in note for note in notes)


def test_train_only_carves_a_validation_split():
    raw = DatasetDict({"train": texts("train", 100)})
    splits, notes = arrange_splits(raw, 10, seed=0)
    assert len(splits["validation"]) == 10
    assert len(splits["train"]) == 90
    assert sorted([*splits["train"]["text"], *splits["validation"]["text"]]) == sorted(raw["train"]["text"])
    assert any("10%" in note for note in notes)


def test_no_train_and_no_test_is_an_error():
    with pytest.raises(FinetuneError, match="no train split"):
        arrange_splits(DatasetDict({"validation": texts("valid", 5)}), 5, seed=0)


# data_files


def test_wikitext_files_map_to_validation_and_test(data_dir):
    folder = data_dir / "wikitext-2-v1"
    assert data_files(folder) == {
        "validation": [str(folder / "wiki.valid.tokens")],
        "test": [str(folder / "wiki.test.tokens")],
    }


def test_files_in_split_named_folders_take_the_folder_split(make_text_file, tmp_path):
    train = make_text_file("corpus/train/part-0.txt", "one\n")
    test = make_text_file("corpus/test/part-0.txt", "two\n")
    assert data_files(tmp_path / "corpus") == {"test": [str(test)], "train": [str(train)]}


def test_a_file_name_split_wins_over_its_folder(make_text_file, tmp_path):
    valid = make_text_file("corpus/train/valid.txt", "one\n")
    train = make_text_file("corpus/train/part-0.txt", "two\n")
    assert data_files(tmp_path / "corpus") == {"train": [str(train)], "validation": [str(valid)]}


def test_datasets_split_keywords_val_and_eval_name_validation_and_test(make_text_file, tmp_path):
    train = make_text_file("corpus/train.txt", "one\n")
    val = make_text_file("corpus/val.txt", "two\n")
    evaluation = make_text_file("corpus/eval.txt", "three\n")
    assert data_files(tmp_path / "corpus") == {
        "test": [str(evaluation)],
        "train": [str(train)],
        "validation": [str(val)],
    }


def test_hidden_and_dunder_folders_of_a_data_folder_are_not_read(make_text_file, tmp_path):
    train = make_text_file("corpus/train.txt", "one\n")
    make_text_file("corpus/.ipynb_checkpoints/train-checkpoint.txt", "one\n")
    make_text_file("corpus/__pycache__/notes.txt", "x\n")
    make_text_file("corpus/.notes.txt", "x\n")
    assert data_files(tmp_path / "corpus") == {"train": [str(train)]}


def test_a_folder_of_train_and_test_folders_never_trains_on_test_texts(
    make_jsonl_file, tmp_path, gpt2_tokenizer
):
    make_jsonl_file(
        "corpus/train/part-0.jsonl", [{"text": f"train sample {i} says hello"} for i in range(40)]
    )
    make_jsonl_file(
        "corpus/test/part-0.jsonl", [{"text": f"test sample {i} says goodbye"} for i in range(40)]
    )
    data = build_datasets(DataArguments(dataset=str(tmp_path / "corpus")), gpt2_tokenizer, 8, seed=0)
    trained = gpt2_tokenizer.decode([token for ids in data.train["input_ids"] for token in ids])
    assert "train sample" in trained
    assert "goodbye" not in trained


# build_datasets


def test_wikitext_offline_builds_packed_samples_from_the_validation_split(gpt2_tokenizer):
    args = DataArguments(dataset="wikitext-2-v1", max_train_samples=10)
    data = build_datasets(args, gpt2_tokenizer, 64, seed=0)
    assert len(data.train) == 10
    assert all(len(ids) == 64 for ids in data.train["input_ids"])
    assert len(data.evaluation) > 0
    assert data.summary.train_samples == 10
    assert any("no train split" in note for note in data.summary.notes)


def test_unknown_text_column_lists_the_available_columns(make_jsonl_file, gpt2_tokenizer):
    path = make_jsonl_file("corpus.jsonl", [{"content": "hello", "title": "t"}] * 40)
    args = DataArguments(dataset=str(path), text_column="nope")
    with pytest.raises(FinetuneError, match="nope") as error:
        build_datasets(args, gpt2_tokenizer, 8, seed=0)
    assert "content" in str(error.value)
    assert "title" in str(error.value)


def test_jsonl_file_with_a_custom_text_column_builds(make_jsonl_file, gpt2_tokenizer):
    rows = [{"content": f"Sample number {i} says hello to the tests."} for i in range(40)]
    path = make_jsonl_file("corpus.jsonl", rows)
    args = DataArguments(dataset=str(path), text_column="content")
    data = build_datasets(args, gpt2_tokenizer, 8, seed=0)
    assert len(data.train) > 0
    assert len(data.evaluation) > 0
    assert data.summary.source == str(path)
    assert gpt2_tokenizer.decode(data.train["input_ids"][0]).startswith("Sample number")


def test_text_too_short_for_one_block_is_an_error(make_text_file, gpt2_tokenizer):
    path = make_text_file("short.txt", "hello\n" * 40)
    with pytest.raises(FinetuneError, match="no train samples"):
        build_datasets(DataArguments(dataset=str(path)), gpt2_tokenizer, 512, seed=0)


def test_empty_text_file_is_an_error(make_text_file, gpt2_tokenizer):
    path = make_text_file("empty.txt", "")
    with pytest.raises(FinetuneError, match="empty data file"):
        build_datasets(DataArguments(dataset=str(path)), gpt2_tokenizer, 8, seed=0)


@pytest.mark.parametrize(
    ("name", "content"), [("header.csv", "text\n"), ("none.json", "[]\n"), ("blank.jsonl", "\n\n")]
)
def test_a_data_file_without_rows_is_named_in_one_error(name, content, make_text_file, gpt2_tokenizer):
    path = make_text_file(name, content)
    with pytest.raises(FinetuneError, match=rf"^{re.escape(str(path))}: no rows in it"):
        build_datasets(DataArguments(dataset=str(path)), gpt2_tokenizer, 8, seed=0)


def test_one_line_text_file_is_an_error(make_text_file, gpt2_tokenizer):
    path = make_text_file("one_line.txt", "just one line of text\n")
    with pytest.raises(FinetuneError, match="too few texts"):
        build_datasets(DataArguments(dataset=str(path)), gpt2_tokenizer, 8, seed=0)


def test_test_split_is_prepared_only_when_asked_for(make_text_file, gpt2_tokenizer):
    for split in ("train", "valid", "test"):
        make_text_file(f"corpus/{split}.txt", f"The {split} split has its own words.\n" * 30)
    folder = make_text_file("corpus/readme.md", "not data").parent
    without = build_datasets(DataArguments(dataset=str(folder)), gpt2_tokenizer, 8, seed=0)
    with_test = build_datasets(
        DataArguments(dataset=str(folder), eval_test_split=True), gpt2_tokenizer, 8, seed=0
    )
    assert without.test is None
    assert gpt2_tokenizer.decode(with_test.test["input_ids"][0]).startswith("The test split")


def test_test_split_of_offline_wikitext_is_already_the_validation_split(gpt2_tokenizer):
    args = DataArguments(dataset="wikitext-2-v1", eval_test_split=True)
    with pytest.raises(FinetuneError, match="no separate test split"):
        build_datasets(args, gpt2_tokenizer, 64, seed=0)


def test_training_on_the_other_wikitext_variant_says_so(gpt2_tokenizer):
    from finetune.data import build_datasets
    from finetune.run_flags import DataArguments

    args = DataArguments(dataset="wikitext-2-raw-v1", block_size=64, max_train_samples=8, max_eval_samples=8)
    notes = build_datasets(args, gpt2_tokenizer, 64, seed=0).summary.notes
    assert any("wikitext-2-raw-v1 is not here: its variant wikitext-2-v1" in note for note in notes)


def test_trained_tokens_are_the_labels_not_ignored_less_each_samples_first():
    samples = Dataset.from_dict(
        {"labels": [[5, 6, 7], [IGNORE_INDEX, IGNORE_INDEX, 3, 4, IGNORE_INDEX], [8]]}
    )
    assert count_label_tokens(samples) == (3 + 2 + 1) - 3
