"""Datasets: resolve a name or files, tokenize with datasets.map, then pack into equal blocks.

Packing concatenates every text of a split and cuts the stream into `block_size` blocks, so no
compute goes to padding and only the last partial block (< block_size tokens) of a split is
dropped. It is done on the Arrow column with numpy rather than in `datasets.map` batches, because
packing per map batch (as run_clm.py does) drops a remainder at every batch boundary.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, load_dataset
from transformers import DataCollatorForSeq2Seq, default_data_collator
from transformers.data.data_collator import DataCollator
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from finetune.data_formats import IGNORE_INDEX
from finetune.errors import FinetuneError, first_line
from finetune.instruction import (
    detect_format,
    encode,
    end_of_turn_ids,
    first_bad_row,
    template_for,
)
from finetune.local_data import load_local, row_place
from finetune.packing import pack_examples, packed_collator, truncate
from finetune.resolve import describe_tried, resolve
from finetune.run_flags import DataArguments

HUB_NAMES = {
    "wikitext-2-raw-v1": ("Salesforce/wikitext", "wikitext-2-raw-v1"),
    "wikitext-2-v1": ("Salesforce/wikitext", "wikitext-2-v1"),
    "wikitext-103-raw-v1": ("Salesforce/wikitext", "wikitext-103-raw-v1"),
    "wikitext-103-v1": ("Salesforce/wikitext", "wikitext-103-v1"),
}
LOCAL_FOLDERS = {
    "wikitext-2-raw-v1": ("wikitext-2-raw-v1", "wikitext-2-v1"),
    "wikitext-2-v1": ("wikitext-2-v1", "wikitext-2-raw-v1"),
    "wikitext-103-raw-v1": ("wikitext-103-raw-v1", "wikitext-103-v1"),
    "wikitext-103-v1": ("wikitext-103-v1", "wikitext-103-raw-v1"),
}
LARGE_DATASET_ROWS = 100_000


@dataclass
class DataSummary:
    """What the run trained and evaluated on, recorded in the run summary."""

    dataset: str
    source: str
    block_size: int
    packing: bool
    train_samples: int
    eval_samples: int
    train_tokens: int
    notes: list[str] = field(default_factory=list)
    data_format: str = "text"
    masked_tokens: int | None = None  # prompt tokens of instruction data, not trained on
    truncated_examples: int | None = None  # training examples longer than block_size
    packing_efficiency: float | None = None  # real tokens / computed tokens of the training blocks


def variant_used(requested: str, source: str) -> str | None:
    """The dataset's other variant when only it was found locally (WikiText's tokenized v1 for the raw
    one asked for: `<unk>` for rare words, another benchmark), said so results are not read as the
    variant asked for; None when the one asked for was used."""
    if requested not in LOCAL_FOLDERS:
        return None
    used = Path(source).name
    return used if used != requested and used in LOCAL_FOLDERS[requested] else None


def load_raw(args: DataArguments) -> tuple[DatasetDict, str]:
    """The dataset's splits as found, and where they came from."""
    hub_id, hub_config = HUB_NAMES.get(args.dataset, (args.dataset, None))
    found = resolve(args.dataset, local_names=LOCAL_FOLDERS.get(args.dataset, ()), hub_id=hub_id)
    if found.local_path is not None:
        if args.dataset_config:  # load_local has no configurations: the flag would be ignored
            raise FinetuneError(
                f"--dataset_config {args.dataset_config}: {found.local_path} is a local dataset, read as "
                "it is; a configuration names one of a Hub dataset's"
            )
        # absolute, so that a record of it names the same files from any folder (evaluation.TrainedWith)
        return load_local(found.local_path), os.path.abspath(found.local_path)
    if found.hub_id is None:
        raise FinetuneError(f"dataset '{args.dataset}' not found; {describe_tried(found)}")
    try:
        raw = load_dataset(found.hub_id, args.dataset_config or hub_config)
    except Exception as error:  # datasets raises many types (ConnectionError, FileNotFoundError, ...)
        raise FinetuneError(
            f"dataset '{args.dataset}' not found; {describe_tried(found)}; the Hub said: {first_line(error)}"
        ) from None
    if not isinstance(raw, DatasetDict):
        raw = DatasetDict({"train": raw})
    return raw, f"hub:{found.hub_id}"


def arrange_splits(raw: DatasetDict, validation_percentage: int, seed: int) -> tuple[DatasetDict, list[str]]:
    """Return train and validation (and test if present), saying what was substituted or carved."""
    notes = []
    splits = dict(raw)
    if "train" not in splits:
        if "validation" in splits and "test" in splits:
            notes.append(
                "this copy of the dataset has no train split: training on its validation split "
                "and evaluating on its test split"
            )
            splits = {"train": splits["validation"], "validation": splits["test"]}
        else:
            raise FinetuneError(f"dataset has no train split (found: {', '.join(sorted(raw)) or 'none'})")
    if "validation" not in splits:
        if len(splits["train"]) < 2:
            raise FinetuneError(
                "too few texts to carve a validation split from train: add text or a validation file"
            )
        carved = splits["train"].train_test_split(test_size=validation_percentage / 100, seed=seed)
        splits["train"], splits["validation"] = carved["train"], carved["test"]
        notes.append(f"no validation split: carved {validation_percentage}% of train for validation")
    return DatasetDict(splits), notes


def tokenize(
    splits: DatasetDict, tokenizer: PreTrainedTokenizerBase, text_column: str, num_proc: int | None
) -> DatasetDict:
    columns = next(iter(splits.values())).column_names
    if text_column not in columns:
        raise FinetuneError(
            f"--text_column '{text_column}' is not in the dataset (columns: {', '.join(columns)})"
        )
    feature = next(iter(splits.values())).features[text_column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise FinetuneError(f"--text_column '{text_column}' holds {describe_feature(feature)}, not text")

    def encode(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        texts = [text or "" for text in batch[text_column]]
        return {"input_ids": tokenizer(texts, add_special_tokens=False)["input_ids"]}

    return DatasetDict(
        {
            name: split.map(
                encode,
                batched=True,
                num_proc=num_proc,
                remove_columns=split.column_names,
                desc=f"tokenize {name}",
            )
            for name, split in splits.items()
        }
    )


def describe_feature(feature: Any) -> str:
    """A datasets feature as a user would name it: `int64 values`, `lists`, `records`."""
    dtype = getattr(feature, "dtype", None)
    if dtype is not None:
        return f"{dtype} values"
    return "records" if isinstance(feature, dict) else "lists"


def token_stream(tokenized: Dataset) -> np.ndarray:
    """Every text's tokens, concatenated in order."""
    column = tokenized.with_format("arrow")["input_ids"]
    stream = pa.chunked_array(column.chunks if isinstance(column, pa.ChunkedArray) else [column])
    if not stream.num_chunks:
        return np.array([], dtype=np.int64)
    return np.concatenate([chunk.flatten().to_numpy() for chunk in stream.chunks]).astype(np.int64)


def pack(tokenized: Dataset, block_size: int) -> Dataset:
    """Cut the concatenated token stream into full blocks; labels equal inputs (the model shifts them)."""
    flat = token_stream(tokenized)
    usable = (len(flat) // block_size) * block_size
    blocks = pa.FixedSizeListArray.from_arrays(pa.array(flat[:usable]), block_size)
    return Dataset.from_dict({"input_ids": blocks, "labels": blocks})


def pad_and_truncate(tokenized: Dataset, block_size: int, pad_token_id: int) -> Dataset:
    """One sample per text, truncated to block_size and right-padded; padding is masked out of the loss."""

    def to_block(batch: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
        out: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
        for ids in batch["input_ids"]:
            ids = ids[:block_size]
            padding = block_size - len(ids)
            out["input_ids"].append(ids + [pad_token_id] * padding)
            out["attention_mask"].append([1] * len(ids) + [0] * padding)
            out["labels"].append(ids + [IGNORE_INDEX] * padding)
        return out

    trainable = tokenized.filter(lambda row: len(row["input_ids"]) >= 2, desc="drop texts under 2 tokens")
    return trainable.map(to_block, batched=True, desc="pad and truncate")


def default_num_proc(rows: int) -> int | None:
    return max(1, (os.cpu_count() or 2) // 2) if rows > LARGE_DATASET_ROWS else None


@dataclass
class PreparedData:
    """What the Trainer gets: train and validation sets, the test set when asked for, and a summary."""

    train: Dataset
    evaluation: Dataset
    test: Dataset | None
    summary: DataSummary
    collator: DataCollator = default_data_collator


def split_tokens(
    raw: DatasetDict, args: DataArguments, tokenizer: PreTrainedTokenizerBase, split: str, seed: int
) -> np.ndarray:
    """One split's concatenated tokens (for `finetune eval`) from the splits `load_raw` found: the split
    of that name, as found.

    Training may stand one split in for another (`arrange_splits`: a copy without train trains on
    validation and validates on test), but an evaluation names the text it scores, so here `test` is
    the test file and `validation` the validation file. The one substitution kept is training's own
    held-out share: a dataset with only train text is evaluated on `validation` as training carved it
    (given the run's seed and percentage: `evaluation.TrainedWith.carving`).
    """
    chosen = named_split(raw, args, split, seed)
    tokenized = tokenize(DatasetDict({split: chosen}), tokenizer, args.text_column, None)
    return token_stream(tokenized[split])


def named_split(raw: DatasetDict, args: DataArguments, split: str, seed: int) -> Dataset:
    """The split of that name, as found, or training's carved validation share of a train-only dataset."""
    if split in raw:
        return raw[split]
    if split == "validation" and set(raw) == {"train"}:
        return arrange_splits(raw, args.validation_split_percentage, seed)[0]["validation"]
    raise FinetuneError(f"dataset '{args.dataset}' has no {split} split (it has: {', '.join(raw)})")


def to_samples(
    tokenized: Dataset, args: DataArguments, tokenizer: PreTrainedTokenizerBase, block_size: int
) -> Dataset:
    if args.packing:
        return pack(tokenized, block_size)
    return pad_and_truncate(tokenized, block_size, tokenizer.pad_token_id)


def build_datasets(
    args: DataArguments,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    seed: int,
    main_process_first: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> PreparedData:
    with main_process_first():
        raw, source = load_raw(args)
        splits, notes = arrange_splits(raw, args.validation_split_percentage, seed)
        variant = variant_used(args.dataset, source)
        if variant:
            notes.insert(0, f"{args.dataset} is not here: its variant {variant} ({source}) is used instead")
        if args.eval_test_split and "test" not in splits:
            used = " (it is the validation split here)" if "test" in raw else ""
            raise FinetuneError(
                f"--eval_test_split: dataset '{args.dataset}' has no separate test split{used}"
            )
        if not args.eval_test_split:
            splits.pop("test", None)
        num_proc = args.preprocessing_num_workers or default_num_proc(len(splits["train"]))
        data_format = detect_format(splits["train"].column_names, args.text_column, args.data_format)
        bad = first_bad_row(next(iter(raw.values())), data_format.name, args.text_column)
        if bad is not None:
            raise FinetuneError(f"{row_place(source, bad[0])}: {bad[1]}")
        notes.insert(0, f"data format: {data_format.description} (--data_format {data_format.name})")
        if data_format.name != "text":
            return instruction_data(args, data_format.name, splits, tokenizer, block_size, source, notes)
        tokenized = tokenize(splits, tokenizer, args.text_column, num_proc)
    samples = {name: to_samples(split, args, tokenizer, block_size) for name, split in tokenized.items()}
    limit_and_check(samples, args, block_size)
    return prepared(
        samples,
        args,
        source,
        block_size,
        notes,
        train_tokens=count_label_tokens(samples["train"]),
        packing_efficiency=real_token_share(samples["train"]),
    )


def prepared(
    samples: dict[str, Dataset],
    args: DataArguments,
    source: str,
    block_size: int,
    notes: list[str],
    collator: DataCollator = default_data_collator,
    **summary: Any,
) -> PreparedData:
    """What both data paths (text and instruction data) hand the Trainer, with the summary fields
    they share; `summary` adds the path's own."""
    return PreparedData(
        train=samples["train"],
        evaluation=samples["validation"],
        test=samples.get("test"),
        summary=DataSummary(
            dataset=args.dataset,
            source=source,
            block_size=block_size,
            packing=args.packing,
            train_samples=len(samples["train"]),
            eval_samples=len(samples["validation"]),
            notes=notes,
            **summary,
        ),
        collator=collator,
    )


def limit_and_check(samples: dict[str, Dataset], args: DataArguments, block_size: int) -> None:
    """--max_train_samples and --max_eval_samples, then refuse a split left without samples."""
    if args.max_train_samples:
        samples["train"] = first(samples["train"], args.max_train_samples)
    if args.max_eval_samples:
        for name in ("validation", "test"):
            if name in samples:
                samples[name] = first(samples[name], args.max_eval_samples)
    for name, dataset in samples.items():
        if len(dataset) == 0:
            raise FinetuneError(
                f"dataset '{args.dataset}' gives no {name} samples of {block_size} tokens: "
                "use more text or a smaller --block_size"
            )


def instruction_data(
    args: DataArguments,
    data_format: str,
    splits: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    source: str,
    notes: list[str],
) -> PreparedData:
    """Prompt-masked examples (finetune/instruction.py), truncated to block_size and packed into
    blocks they cannot see across (finetune/packing.py), or padded per batch with --packing false.

    Chat data sets tokenizer.chat_template to the template it was rendered with, so the saved model
    carries it for `from_pretrained` users.
    """
    template = template_for(data_format, args.data_format, tokenizer, args.chat_template)
    if template:
        tokenizer.chat_template = template
    if template and data_format not in ("messages", "sharegpt"):
        notes.append(
            "rendered through the tokenizer's chat template, as a user turn and an assistant turn "
            f"(--data_format {data_format} keeps the plain layout)"
        )
    samples, real_tokens, truncated = {}, {}, {}
    for name, split in splits.items():
        encoded = encode(split, data_format, tokenizer, template, args.train_on_prompt, name)
        examples = encoded.filter(
            lambda row: any(label != IGNORE_INDEX for label in row["labels"][:block_size]),
            desc=f"drop {name} examples without an answer token in the first {block_size}",
        )
        if name == "train" and len(encoded) and not len(examples):
            raise FinetuneError(
                f"{source}: none of its {len(encoded)} {name} examples has an answer to train on (every "
                f"answer is empty, or starts after the first {block_size} tokens)"
            )
        if len(examples) < len(encoded):
            notes.append(
                f"{len(encoded) - len(examples)} {name} examples have no answer (an empty one, or none in "
                f"their first {block_size} tokens) and were left out"
            )
        examples, truncated[name] = truncate(examples, block_size)
        if truncated[name]:
            notes.append(f"{truncated[name]} {name} examples longer than {block_size} tokens were truncated")
        if args.packing:
            samples[name], real_tokens[name] = pack_examples(examples, block_size, tokenizer.pad_token_id)
        else:
            samples[name], real_tokens[name] = examples, [len(ids) for ids in examples["input_ids"]]
    limit_and_check(samples, args, block_size)
    kept = len(samples["train"])
    real = sum(real_tokens["train"][:kept])
    labels = flat_column(samples["train"], "labels")
    trained = int((labels != IGNORE_INDEX).sum())
    stops = end_of_turn_ids(tokenizer)
    if stops and not np.isin(labels, stops).any():
        names = ", ".join(tokenizer.convert_ids_to_tokens(stops))
        notes.append(
            f"no trained answer ends with an end-of-turn token ({names}): the model will not learn to stop "
            "generating (train on it, or use a template whose answers end with one)"
        )
    padded = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
    return prepared(
        samples,
        args,
        source,
        block_size,
        notes,
        packed_collator if args.packing else padded,
        train_tokens=trained,
        data_format=data_format,
        masked_tokens=real - trained,
        truncated_examples=truncated["train"],
        packing_efficiency=real / (kept * block_size) if args.packing else None,
    )


def first(dataset: Dataset, count: int) -> Dataset:
    return dataset.select(range(min(count, len(dataset))))


def flat_column(dataset: Dataset, column: str) -> np.ndarray:
    """A list column's values, every sample's in one array (samples may differ in length)."""
    if not len(dataset):
        return np.array([], dtype=np.int64)
    return pc.list_flatten(dataset.with_format("arrow")[column]).to_numpy()


def real_token_share(samples: Dataset) -> float:
    """Packing efficiency of text blocks: padded samples carry an attention mask, packed ones are full."""
    if "attention_mask" not in samples.column_names:
        return 1.0
    return float(flat_column(samples, "attention_mask").mean())


def count_label_tokens(dataset: Dataset) -> int:
    """Tokens that enter the loss: labels that are not padding, less the first of each sample.
    Counted on the column's flattened values: read as numpy, the column came a sample at a time, and
    that was most of a small run's data preparation."""
    return int((flat_column(dataset, "labels") != IGNORE_INDEX).sum() - len(dataset))
