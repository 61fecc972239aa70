"""Token-weighted evaluation loss and perplexity, through the Trainer's own metric hooks.

The Trainer's `eval_loss` is a mean of per-batch mean losses, so a batch with few real tokens
weighs as much as a full one, and each rank's batches are averaged before the ranks are. Perplexity
must be exp of the mean over every evaluated token. Each rank turns its logits into two numbers
per sample (summed token loss, token count) in `preprocess_logits_for_metrics`; the Trainer
gathers them across ranks (dropping the samples the distributed sampler repeated to even out the
last batch) and `token_weighted_loss` divides the totals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import EvalPrediction

from finetune.arguments import DataArguments, ModelArguments
from finetune.checkpoint import load_weights_only
from finetune.data import IGNORE_INDEX, split_tokens
from finetune.errors import FinetuneError
from finetune.models import build_model, choose_block_size, load_config, load_tokenizer, resolve_model


def loss_sums_per_sample(
    logits: torch.Tensor | tuple[torch.Tensor, ...], labels: torch.Tensor
) -> torch.Tensor:
    """[batch, 2]: each sample's summed next-token loss and its number of predicted tokens.

    One sample at a time, so the float32 copy of the logits is one sample's, not the batch's.
    """
    if isinstance(logits, tuple):
        logits = logits[0]
    targets = labels[:, 1:]
    sums = torch.stack(
        [
            F.cross_entropy(
                logits[i, :-1].float(), targets[i], ignore_index=IGNORE_INDEX, reduction="sum"
            ).double()
            for i in range(logits.shape[0])
        ]
    )
    counts = (targets != IGNORE_INDEX).sum(dim=1).double()
    return torch.stack([sums, counts], dim=1)


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
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]
        for length in sorted({w.end - w.begin for w in batch}):
            group = [w for w in batch if w.end - w.begin == length]
            inputs = torch.stack([tokens[w.begin : w.end] for w in group]).to(device)
            labels = torch.stack([window_labels(tokens, w) for w in group]).to(device)
            sums = loss_sums_per_sample(model(input_ids=inputs).logits, labels)
            loss_sum += float(sums[:, 0].sum())
            count += int(sums[:, 1].sum())
    return loss_sum, count


def evaluate_saved_model(
    model_path: str,
    data_args: DataArguments,
    split: str,
    block_size: int | None,
    stride: int | None,
    batch_size: int,
    max_tokens: int | None,
) -> dict[str, Any]:
    """Perplexity of a saved model folder on one split. Split over processes under accelerate launch.

    The folder's pickles are read weights-only and its custom code never runs (no --trust_remote_code here).
    """
    load_weights_only()
    if batch_size < 1:
        raise FinetuneError(f"--batch_size must be at least 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise FinetuneError(f"--max_tokens must be at least 1, got {max_tokens}")
    state = PartialState()
    location = resolve_model(model_path)
    model_args = ModelArguments(model=model_path)
    config = load_config(model_args, location)
    block_size = choose_block_size(block_size, config)
    stride = block_size if stride is None else stride
    if not 0 < stride <= block_size:
        raise FinetuneError(f"--stride must be between 1 and the block size ({block_size}), got {stride}")
    tokenizer = load_tokenizer(model_args, location)
    with state.main_process_first():
        tokens = torch.from_numpy(split_tokens(data_args, tokenizer, split, seed=42))
    tokens = tokens[:max_tokens] if max_tokens else tokens
    windows = sliding_windows(len(tokens), block_size, stride)
    if not windows:
        raise FinetuneError(f"the {split} split has fewer than 2 tokens")
    model = build_model(model_args, config, location).to(state.device).eval()
    with state.split_between_processes(windows) as mine:
        local = sliding_window_loss(model, tokens, mine, batch_size)
    totals = gather_object([local])
    loss_sum, count = sum(part[0] for part in totals), sum(part[1] for part in totals)
    loss = loss_sum / count
    return {
        "model": model_path,
        "dataset": data_args.dataset,
        "split": split,
        "block_size": block_size,
        "stride": stride,
        "windows": len(windows),
        "tokens": count,
        "loss": loss,
        "perplexity": perplexity(loss),
    }
