"""Token-weighted evaluation loss and perplexity, through the Trainer's own metric hooks.

The Trainer's `eval_loss` is a mean of per-batch mean losses, so a batch with few real tokens
weighs as much as a full one, and each rank's batches are averaged before the ranks are. Perplexity
must be exp of the mean over every evaluated token. Each rank turns its logits into two numbers
per sample (summed token loss, token count) in `preprocess_logits_for_metrics`; the Trainer
gathers them across ranks (dropping the samples the distributed sampler repeated to even out the
last batch) and `token_weighted_loss` divides the totals.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from datasets import Dataset
from tqdm import tqdm
from transformers import (
    DataCollatorForSeq2Seq,
    EvalPrediction,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainingArguments,
)

from finetune.checkpoint import load_weights_only
from finetune.data import load_raw, named_split, split_tokens, variant_used
from finetune.data_formats import IGNORE_INDEX
from finetune.errors import FinetuneError
from finetune.generate import check_stop_texts, complete_greedily
from finetune.instruction import detect_format, encode, template_for
from finetune.losses import loss_sums_per_sample
from finetune.models import SavedModel, choose_block_size, context_length
from finetune.packing import truncate
from finetune.run_flags import DataArguments, check_block_size
from finetune.run_folder import MANIFEST, SUMMARY_FILE


def perplexity(loss: float) -> float:
    """exp(loss), or infinity when the loss is too large to exponentiate."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def token_weighted_loss(prediction: EvalPrediction) -> dict[str, float]:
    """`compute_metrics`: mean loss over all evaluated tokens of all ranks, and its perplexity."""
    sums = np.asarray(prediction.predictions, dtype=np.float64).reshape(-1, 2)
    loss_sum, tokens = float(sums[:, 0].sum()), float(sums[:, 1].sum())
    if tokens == 0:
        return {"tokens": 0}
    loss = loss_sum / tokens
    return {"token_loss": loss, "perplexity": perplexity(loss), "tokens": int(tokens)}


# `finetune eval`: perplexity of a saved model on a split, by the sliding-window method
# (https://huggingface.co/docs/transformers/perplexity): windows of `block_size` tokens start every
# `stride` tokens over the split's concatenated text, and each window predicts only the tokens the
# previous window did not, with the rest of the window as context. stride == block_size gives the
# training-time evaluation's blocks; a smaller stride gives every token more context.


@dataclass(frozen=True)
class Window:
    begin: int
    end: int
    targets: int  # tokens at the end of the window that this window predicts


def sliding_windows(length: int, block_size: int, stride: int) -> list[Window]:
    windows, previous_end = [], 0
    for begin in range(0, length, stride):
        end = min(begin + block_size, length)
        if end - begin < 2:
            break
        windows.append(Window(begin, end, end - previous_end))
        previous_end = end
        if end == length:
            break
    return windows


def window_labels(tokens: torch.Tensor, window: Window) -> torch.Tensor:
    labels = tokens[window.begin : window.end].clone()
    labels[: len(labels) - window.targets] = IGNORE_INDEX
    return labels


@torch.no_grad()
def sliding_window_loss(
    model: torch.nn.Module, tokens: torch.Tensor, windows: list[Window], batch_size: int
) -> tuple[float, int]:
    """Summed next-token loss and token count over the windows (same-length windows are batched)."""
    device = next(model.parameters()).device
    loss_sum, count = 0.0, 0
    shown = PartialState().is_main_process  # each rank evaluates its share; one bar
    with tqdm(total=len(windows), desc="eval", unit="window", disable=not shown) as progress:
        for start in range(0, len(windows), batch_size):
            batch = windows[start : start + batch_size]
            for length in sorted({w.end - w.begin for w in batch}):
                group = [w for w in batch if w.end - w.begin == length]
                inputs = torch.stack([tokens[w.begin : w.end] for w in group]).to(device)
                labels = torch.stack([window_labels(tokens, w) for w in group]).to(device)
                sums = loss_sums_per_sample(model(input_ids=inputs).logits, labels)
                loss_sum += float(sums[:, 0].sum())
                count += int(sums[:, 1].sum())
            progress.update(len(batch))
    return loss_sum, count


# the seed a run carves a held-out share with unless --seed says otherwise
DEFAULT_SEED = next(field.default for field in fields(TrainingArguments) if field.name == "seed")


@dataclass(frozen=True)
class TrainedWith:
    """What the run that saved a model folder trained with, as far as evaluating it needs, read from its
    output_dir's run_summary.json or a checkpoint's manifest (the run's flags); unknown elsewhere.

    A model is evaluated at the length it learned, not at a longer context it never saw. And the
    `validation` of a dataset with only train text is the share the run held out, carved with the run's
    seed and percentage: carved with other ones it is mostly text the model trained on. An exported
    folder has neither record: `finetune export` writes this one beside its weights (FILE).
    """

    FILE = "finetune_trained_with.json"

    block_size: int | None = None
    dataset: str | None = None
    data_source: str | None = None
    seed: int | None = None
    validation_split_percentage: int | None = None

    @classmethod
    def read(cls, folder: str) -> TrainedWith:
        for read in (_summary_record, _manifest_record, _export_record):
            try:
                record = read(Path(folder))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            return cls.of(record)
        return cls()

    @classmethod
    def of(cls, record: dict[str, Any]) -> TrainedWith:
        """The fields from a run's flags or summary; a value of the wrong type is unknown."""
        return cls(
            block_size=_count(record.get("block_size"), lowest=2),
            dataset=record.get("dataset") if isinstance(record.get("dataset"), str) else None,
            data_source=record.get("data_source") if isinstance(record.get("data_source"), str) else None,
            seed=_count(record.get("seed"), lowest=0),
            validation_split_percentage=_count(record.get("validation_split_percentage"), lowest=1),
        )

    def write(self, folder: str | Path) -> None:
        (Path(folder) / self.FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def trained_on(self, dataset: str, source: str) -> bool:
        """The run's data by its name as given, or by the files it was read from (by any path to them)."""
        if dataset == self.dataset or source == self.data_source:
            return True
        local = [place for place in (source, self.data_source) if place and not place.startswith("hub:")]
        return len(local) == 2 and os.path.realpath(local[0]) == os.path.realpath(local[1])

    def carving(self, data_args: DataArguments, source: str) -> tuple[DataArguments, int]:
        """The data flags and seed that carve the run's own held-out share of the data it trained on."""
        if not self.trained_on(data_args.dataset, source):
            return data_args, DEFAULT_SEED
        share = self.validation_split_percentage or data_args.validation_split_percentage
        seed = DEFAULT_SEED if self.seed is None else self.seed
        return replace(data_args, validation_split_percentage=share), seed


def _summary_record(folder: Path) -> dict[str, Any]:
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    arguments = summary.get("arguments") or {}
    return {
        **arguments,
        **{key: summary.get(key) for key in ("block_size", "dataset", "data_source", "seed")},
    }


def _manifest_record(folder: Path) -> dict[str, Any]:
    run = json.loads((folder / MANIFEST).read_text())["run"]
    return {**run["flags"], "data_source": run.get("data_source")}


def _export_record(folder: Path) -> dict[str, Any]:
    return json.loads((folder / TrainedWith.FILE).read_text())


def _count(value: Any, lowest: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= lowest else None


def evaluate_saved_model(
    model_path: str,
    data_args: DataArguments,
    split: str,
    block_size: int | None,
    stride: int | None,
    batch_size: int,
    max_tokens: int | None,
    answers: AnswerCheck | None = None,
    max_examples: int | None = None,
) -> dict[str, Any]:
    """Perplexity of a saved model folder on one split; on instruction data, the answer-only loss and
    with `answers` the exact match of generated answers. Split over processes under accelerate launch.

    The folder's pickles are read weights-only and its custom code never runs (no --trust_remote_code here).
    """
    load_weights_only()
    if batch_size < 1:
        raise FinetuneError(f"--batch_size must be at least 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise FinetuneError(f"--max_tokens must be at least 1, got {max_tokens}")
    if max_examples is not None and max_examples < 1:
        raise FinetuneError(f"--max_examples must be at least 1, got {max_examples}")
    if block_size is not None:
        check_block_size(block_size)
    state = PartialState()
    saved = SavedModel.at(model_path)
    config = saved.config()
    trained = TrainedWith.read(saved.location)
    block_size = choose_block_size(block_size or trained.block_size, config)
    with state.main_process_first():
        raw, source = load_raw(data_args)
    data_args, seed = trained.carving(data_args, source)
    scores_training_text = split == "validation" and "train" not in raw  # arrange_splits trains on it
    if scores_training_text and trained.trained_on(data_args.dataset, source) and state.is_main_process:
        print(
            f"finetune: note: {data_args.dataset} here has no train split, so runs on it train on its "
            "validation split: this is text the model trained on (--split test is held out)",
            file=sys.stderr,
        )
    # results name the data actually used: the dataset's other variant when only it is here
    dataset = {
        "dataset": data_args.dataset,
        "dataset_used": variant_used(data_args.dataset, source) or data_args.dataset,
    }
    data_format = detect_format(
        next(iter(raw.values())).column_names, data_args.text_column, data_args.data_format
    )
    if data_format.name != "text":
        if stride is not None or max_tokens is not None:
            raise FinetuneError(
                "--stride and --max_tokens are for plain text; instruction data is evaluated example by "
                "example (--max_examples)"
            )
        examples = named_split(raw, data_args, split, seed)
        examples = examples.select(range(min(max_examples, len(examples)))) if max_examples else examples
        tokenizer = saved.tokenizer()
        model = saved.model(config).to(state.device).eval()
        result = evaluate_examples(
            model, tokenizer, examples, data_format.name, data_args, block_size, batch_size, answers
        )
        return {"model": model_path, **dataset, "split": split, **result}
    if answers is not None or max_examples is not None:
        flag = "--generate" if answers is not None else "--max_examples"
        raise FinetuneError(
            f"{flag} needs prompts and answers; dataset '{data_args.dataset}' is "
            "plain text (docs/instruction-data.md lists the formats)"
        )
    stride = block_size if stride is None else stride
    if not 0 < stride <= block_size:
        raise FinetuneError(f"--stride must be between 1 and the block size ({block_size}), got {stride}")
    tokenizer = saved.tokenizer()
    with state.main_process_first():
        tokens = torch.from_numpy(split_tokens(raw, data_args, tokenizer, split, seed))
    tokens = tokens[:max_tokens] if max_tokens else tokens
    windows = sliding_windows(len(tokens), block_size, stride)
    if not windows:
        raise FinetuneError(f"the {split} split has fewer than 2 tokens")
    model = saved.model(config).to(state.device).eval()
    with state.split_between_processes(windows) as mine:
        local = sliding_window_loss(model, tokens, mine, batch_size)
    totals = gather_object([local])
    loss_sum, count = sum(part[0] for part in totals), sum(part[1] for part in totals)
    loss = loss_sum / count
    return {
        "model": model_path,
        **dataset,
        "split": split,
        "block_size": block_size,
        "stride": stride,
        "windows": len(windows),
        "tokens": count,
        "loss": loss,
        "perplexity": perplexity(loss),
    }


# `finetune eval` on instruction data: the loss over the answer tokens of each example alone, and with
# --generate each prompt completed greedily and its answer compared with the reference's.


@dataclass(frozen=True)
class AnswerCheck:
    """--generate: the answer is what `pattern` (its first group, else its whole match) finds in the
    text; without a pattern, the whole text. Both are stripped of surrounding whitespace."""

    pattern: str | None
    max_new_tokens: int
    stop: tuple[str, ...] = ()  # --stop: text that ends a completion, beside the end-of-turn tokens

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise FinetuneError(f"--max_new_tokens must be at least 1, got {self.max_new_tokens}")
        check_stop_texts(self.stop)
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as error:
                raise FinetuneError(
                    f"--answer_pattern {self.pattern!r}: not a regular expression ({error})"
                ) from None

    def extract(self, text: str) -> str | None:
        if self.pattern is None:
            return text.strip()
        found = re.search(self.pattern, text)
        if found is None:
            return None
        return (found.group(1) if found.re.groups else found.group(0)).strip()


def last_answer(labels: list[int]) -> tuple[int, int]:
    """Where the example's last run of labelled tokens (its last answer) begins and ends."""
    end = max(index for index, label in enumerate(labels) if label != IGNORE_INDEX) + 1
    begin = end
    while begin > 0 and labels[begin - 1] != IGNORE_INDEX:
        begin -= 1
    return begin, end


def prompts_and_references(
    encoded: Dataset, tokenizer: PreTrainedTokenizerBase, room: int
) -> tuple[list[list[int]], list[str], int]:
    """Each example's tokens before its last answer, cut to their last `room`; that answer decoded as
    a completion is (special tokens dropped); and how many prompts were cut."""
    prompts, references, truncated = [], [], 0
    for ids, labels in zip(encoded["input_ids"], encoded["labels"], strict=True):
        begin, end = last_answer(labels)
        prompts.append(ids[max(begin - room, 0) : begin])
        references.append(tokenizer.decode(ids[begin:end], skip_special_tokens=True))
        truncated += begin > room
    return prompts, references, truncated


@torch.no_grad()
def example_loss(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, examples: Dataset, batch_size: int
) -> tuple[float, int]:
    """Summed loss and count of the labelled tokens, each example alone (right-padded in its batch)."""
    device = next(model.parameters()).device
    collate = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, return_tensors="pt")
    loss_sum, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        batch = collate([examples[index] for index in range(start, min(start + batch_size, len(examples)))])
        batch = {name: tensor.to(device) for name, tensor in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        sums = loss_sums_per_sample(logits, batch["labels"])
        loss_sum += float(sums[:, 0].sum())
        count += int(sums[:, 1].sum())
    return loss_sum, count


def evaluate_examples(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Dataset,
    data_format: str,
    data_args: DataArguments,
    block_size: int,
    batch_size: int,
    answers: AnswerCheck | None,
) -> dict[str, Any]:
    """Loss (and exact match) over the examples, tokenized exactly as training tokenizes them.

    A prompt is the example's tokens before its last answer (for chat: the conversation up to the last
    assistant turn, with the generation prompt); the reference is that answer's tokens decoded as a
    completion is (special tokens dropped). A prompt longer than the context leaves for the answer
    is cut to its last tokens, and counted.
    """
    state = PartialState()
    template = template_for(data_format, data_args.data_format, tokenizer, data_args.chat_template)
    encoded = encode(rows, data_format, tokenizer, template, False, "evaluation")
    encoded = encoded.filter(lambda row: any(label != IGNORE_INDEX for label in row["labels"]))
    if not len(encoded):
        raise FinetuneError(f"dataset '{data_args.dataset}' has no example with an answer to evaluate")
    result: dict[str, Any] = {"data_format": data_format, "examples": len(encoded), "block_size": block_size}
    with state.split_between_processes(list(range(len(encoded)))) as mine:
        local = example_loss(model, tokenizer, truncate(encoded.select(mine), block_size)[0], batch_size)
    totals = gather_object([local])
    loss = sum(part[0] for part in totals) / sum(part[1] for part in totals)
    result.update(tokens=sum(part[1] for part in totals), loss=loss, perplexity=perplexity(loss))
    if answers is None:
        return result

    room = (context_length(model.config) or block_size) - answers.max_new_tokens
    if room < 1:
        raise FinetuneError(
            f"--max_new_tokens {answers.max_new_tokens} leaves no room for a prompt in the model's context"
        )
    prompts, references, truncated = prompts_and_references(encoded, tokenizer, room)
    expected = [answers.extract(reference) for reference in references]
    unmatched = [index for index, answer in enumerate(expected) if answer is None]
    if unmatched:
        raise FinetuneError(
            f"--answer_pattern {answers.pattern!r} finds no answer in {len(unmatched)} of {len(expected)} "
            f"references (the first: example {unmatched[0] + 1}, {references[unmatched[0]][-80:]!r})"
        )
    with state.split_between_processes(list(range(len(prompts)))) as mine:
        local = complete_greedily(
            model,
            tokenizer,
            [prompts[index] for index in mine],
            answers.max_new_tokens,
            batch_size,
            answers.stop,
        )
    completions = [text for part in gather_object([local]) for text in part]
    extracted = [answers.extract(text) for text in completions]
    correct = sum(found == answer for found, answer in zip(extracted, expected, strict=True))
    result["_completions"] = [
        {"prompt": tokenizer.decode(prompt), "completion": text, "answer": found, "reference": reference,
         "expected": answer, "correct": found == answer}
        for prompt, text, found, reference, answer in zip(
            prompts, completions, extracted, references, expected, strict=True
        )
    ]  # fmt: skip
    result.update(
        answer_pattern=answers.pattern,
        max_new_tokens=answers.max_new_tokens,
        prompts_truncated=truncated,
        exact_match_correct=correct,
        exact_match_total=len(expected),
        exact_match=correct / len(expected),
    )
    return result
