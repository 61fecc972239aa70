"""The model changes every run makes before training (finetune/converters.py) beyond those its flags
ask for: each tested by what it changes in a forward."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, PreTrainedModel

from finetune.converters import convert, without_padding_check, without_training_logits
from finetune.losses import loss_sums_per_sample


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


NO_FLAGS = SimpleNamespace(peft=None, chunked_loss=False, align_output_matmul=False, fp8=False)


def test_every_run_converts_its_model_without_the_padding_check(model_with_a_pad_token, padding_checks):
    model, _ = convert(model_with_a_pad_token, NO_FLAGS, NO_FLAGS, None, "fp32")
    model(batch_ending_in_the_pad_token(model))
    assert padding_checks == []


@pytest.fixture
def bf16_prepared(tiny_gpt2_dir):
    """(unconverted, converted): the same tiny GPT-2 each under accelerate's bf16 mixed precision, whose
    forward wrapper copies every bf16 output to fp32; in training mode, as the Trainer sets it."""

    def prepared(model):
        return Accelerator(mixed_precision="bf16", cpu=True).prepare(model.train())

    # accelerate's state is per process and another test in it may have set its precision
    AcceleratorState._reset_state(reset_partial_state=True)
    converted, _ = without_training_logits(
        AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir), None, None, None, "bf16"
    )
    yield prepared(AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir)), prepared(converted)
    AcceleratorState._reset_state(reset_partial_state=True)


def test_an_unconverted_training_forward_returns_logits_copied_to_fp32(bf16_prepared):
    unconverted, _ = bf16_prepared
    ids = torch.randint(0, 1000, (2, 16))
    assert unconverted(input_ids=ids, labels=ids).logits.dtype == torch.float32


def test_a_training_forward_with_labels_returns_its_loss_without_logits(bf16_prepared):
    _, converted = bf16_prepared
    ids = torch.randint(0, 1000, (2, 16))
    outputs = converted(input_ids=ids, labels=ids)
    assert outputs.loss is not None and outputs.logits is None and "logits" not in outputs


def test_leaving_out_the_training_logits_changes_no_loss_and_no_gradient(bf16_prepared):
    unconverted, converted = bf16_prepared
    ids = torch.randint(0, 1000, (2, 16))
    losses = []
    for model in (unconverted, converted):
        torch.manual_seed(0)  # the same dropout masks
        losses.append(model(input_ids=ids, labels=ids).loss)
        losses[-1].backward()
    assert torch.equal(losses[0], losses[1])
    for before, after in zip(unconverted.parameters(), converted.parameters(), strict=True):
        assert torch.equal(before.grad, after.grad)


def test_evaluation_returns_the_metrics_loss_sums_in_place_of_the_logits(bf16_prepared):
    """The same numbers the Trainer's preprocess makes of the fp32 copy (bf16 to fp32 is exact),
    without the copy of a block's logits."""
    unconverted, converted = bf16_prepared
    ids = torch.randint(0, 1000, (2, 16))
    with torch.no_grad():
        sums = converted.eval()(input_ids=ids, labels=ids).logits
        logits = unconverted.eval()(input_ids=ids, labels=ids).logits
    assert logits.dtype == torch.float32 and logits.shape == (2, 16, converted.config.vocab_size)
    assert torch.equal(sums, loss_sums_per_sample(logits, ids))


def test_evaluation_loss_is_the_models_own_counted_from_the_sums_without_its_loss_function(
    bf16_prepared, monkeypatch
):
    """Eager, the model's own loss copies a block's logits to fp32 and takes their softmax whole."""
    unconverted, converted = bf16_prepared
    ids = torch.randint(0, 1000, (2, 16))
    with torch.no_grad():
        own = unconverted.eval()(input_ids=ids, labels=ids).loss
        monkeypatch.setattr(type(converted), "loss_function", property(lambda self: pytest.fail("own loss")))
        counted = converted.eval()(input_ids=ids, labels=ids).loss
    assert counted.dtype == torch.float32
    torch.testing.assert_close(counted, own, rtol=1e-6, atol=0)


def test_evaluation_without_labels_or_of_a_split_sequence_returns_the_logits(bf16_prepared):
    """Generation, and a Ulysses rank's slice, whose labels come shifted (`shift_labels`)."""
    _, converted = bf16_prepared
    converted.eval()
    ids = torch.randint(0, 1000, (2, 16))
    with torch.no_grad():
        assert converted(input_ids=ids).logits.dim() == 3
        shifted = torch.nn.functional.pad(ids, (0, 1), value=-100)[..., 1:].contiguous()
        assert converted(input_ids=ids, labels=ids, shift_labels=shifted).logits.dim() == 3


def test_a_training_forward_without_labels_still_returns_the_logits(bf16_prepared):
    """The Trainer's label smoothing takes the labels away and computes the loss from the logits."""
    _, converted = bf16_prepared
    assert converted(input_ids=torch.randint(0, 1000, (2, 16))).logits is not None


def test_training_logits_stay_out_under_adapters_added_after(model_with_a_pad_token):
    model, _ = convert(model_with_a_pad_token, NO_FLAGS, NO_FLAGS, None, "fp32")
    adapted = get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True)).train()
    ids = torch.randint(0, 1000, (2, 16))
    assert adapted(input_ids=ids, labels=ids).logits is None
