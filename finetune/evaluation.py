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

import numpy as np
import torch
import torch.nn.functional as F
from transformers import EvalPrediction

from finetune.data import IGNORE_INDEX


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
