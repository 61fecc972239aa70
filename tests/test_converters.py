"""The model changes every run makes before training (finetune/converters.py) beyond those its flags
ask for: each tested by what it changes in a forward."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, PreTrainedModel

from finetune.converters import convert, without_padding_check


@pytest.fixture
def padding_checks(monkeypatch) -> list[int]:
    """Counts transformers' padding check as forwards call it (each call two host syncs on a GPU)."""
    calls: list[int] = []
    monkeypatch.setattr(
        PreTrainedModel, "warn_if_padding_and_no_attention_mask", lambda self, ids, mask: calls.append(1)
    )
    return calls


@pytest.fixture
def model_with_a_pad_token(tiny_gpt2_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir)
    model.config.pad_token_id = model.config.eos_token_id  # what run.py gives GPT-2
    return model


def batch_ending_in_the_pad_token(model) -> torch.Tensor:
    ids = torch.randint(0, 1000, (2, 16))
    ids[:, -1] = model.config.pad_token_id
    return ids


def test_a_forward_without_a_mask_runs_transformers_padding_check_unconverted(
    model_with_a_pad_token, padding_checks
):
    model_with_a_pad_token(batch_ending_in_the_pad_token(model_with_a_pad_token))
    assert padding_checks


def test_a_converted_models_forward_without_a_mask_skips_the_padding_check(
    model_with_a_pad_token, padding_checks
):
    model, fields = without_padding_check(model_with_a_pad_token, None, None, None, "fp32")
    model(batch_ending_in_the_pad_token(model))
    assert padding_checks == [] and fields == {}


def test_the_padding_check_stays_off_under_adapters_added_after_it(model_with_a_pad_token, padding_checks):
    model, _ = without_padding_check(model_with_a_pad_token, None, None, None, "fp32")
    adapted = get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
    adapted(batch_ending_in_the_pad_token(model))
    assert padding_checks == []


def test_leaving_out_the_padding_check_changes_no_logit(model_with_a_pad_token):
    ids = batch_ending_in_the_pad_token(model_with_a_pad_token)
    with torch.no_grad():
        before = model_with_a_pad_token(ids).logits
        model, _ = without_padding_check(model_with_a_pad_token, None, None, None, "fp32")
        assert torch.equal(model(ids).logits, before)


def test_every_run_converts_its_model_without_the_padding_check(model_with_a_pad_token, padding_checks):
    no_flags = SimpleNamespace(peft=None, chunked_loss=False, align_output_matmul=False, fp8=False)
    model, _ = convert(model_with_a_pad_token, no_flags, no_flags, None, "fp32")
    model(batch_ending_in_the_pad_token(model))
    assert padding_checks == []
