"""Token-weighted evaluation loss: per-sample sums on each rank, divided once over all tokens."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import EvalPrediction

from finetune.evaluation import loss_sums_per_sample, perplexity, token_weighted_loss


def test_loss_sums_reproduce_the_models_shifted_mean_loss():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 6, 11), torch.randint(0, 11, (2, 6))
    sums = loss_sums_per_sample(logits, labels)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))
    assert sums[:, 1].tolist() == [5.0, 5.0]
    assert (sums[:, 0].sum() / sums[:, 1].sum()).item() == pytest.approx(expected.item(), rel=1e-6)


def test_padding_labels_are_not_counted():
    logits, labels = torch.zeros(1, 6, 4), torch.tensor([[1, 2, 3, -100, -100, -100]])
    sums = loss_sums_per_sample(logits, labels)
    assert sums[0, 1].item() == 2.0
    assert sums[0, 0].item() == pytest.approx(2 * math.log(4))


def test_logits_in_a_tuple_are_unpacked():
    logits, labels = torch.zeros(1, 3, 4), torch.tensor([[1, 2, 3]])
    assert loss_sums_per_sample((logits,), labels).tolist() == loss_sums_per_sample(logits, labels).tolist()


def test_loss_is_weighted_by_tokens_not_by_samples():
    # sample A: 5 tokens, mean loss 2.0; sample B: 1 token, loss 6.0
    prediction = EvalPrediction(predictions=np.array([[10.0, 5.0], [6.0, 1.0]]), label_ids=np.zeros((2, 1)))
    metrics = token_weighted_loss(prediction)
    assert metrics["token_loss"] == pytest.approx(16.0 / 6.0)  # a mean of sample means would be 4.0
    assert metrics["tokens"] == 6
    assert metrics["perplexity"] == pytest.approx(math.exp(16.0 / 6.0))


def test_perplexity_of_a_huge_loss_is_infinite():
    assert perplexity(1e6) == math.inf
