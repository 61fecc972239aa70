"""FLOPs per token against a hand count of GPT-2 small, and the peak-FLOP/s table."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from finetune.flops import (
    flops_per_token,
    matmul_parameters,
    mfu,
    model_flops_per_token,
    peak_flops,
    tf32_matmuls,
)

# GPT-2 small as published: 12 layers, width 768, vocabulary 50257, context 1024.
LAYERS, WIDTH, VOCAB, CONTEXT = 12, 768, 50257, 1024
PER_BLOCK = 12 * WIDTH**2 + 13 * WIDTH  # qkv 3H²+3H, proj H²+H, MLP 8H²+5H, two layer norms 4H
GPT2_SMALL_MATMUL = LAYERS * PER_BLOCK + VOCAB * WIDTH + 2 * WIDTH  # blocks + tied head + final norm


def meta_gpt2(data_dir, **overrides):
    config = AutoConfig.from_pretrained(data_dir / "gpt2", **overrides)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config), config


def test_hand_count_is_gpt2_smalls_published_size_less_position_embeddings():
    assert GPT2_SMALL_MATMUL == 123_653_376
    assert GPT2_SMALL_MATMUL + CONTEXT * WIDTH == 124_439_808


def test_gpt2_small_matmul_parameters_match_the_hand_count(data_dir):
    model, _ = meta_gpt2(data_dir)
    assert matmul_parameters(model) == GPT2_SMALL_MATMUL


def test_an_untied_lm_head_is_the_same_multiply_as_a_tied_one(data_dir):
    model, _ = meta_gpt2(data_dir, tie_word_embeddings=False)
    assert matmul_parameters(model) == GPT2_SMALL_MATMUL


def test_gpt2_small_flops_per_token_at_full_context(data_dir):
    model, config = meta_gpt2(data_dir)
    expected = 6 * 123_653_376 + 12 * 12 * 768 * 1024
    assert expected == 855_166_464
    assert model_flops_per_token(model, config, CONTEXT) == expected


def test_attention_term_grows_with_sequence_length():
    assert flops_per_token(100, 2, 8, 32) - flops_per_token(100, 2, 8, 16) == 12 * 2 * 8 * 16


@pytest.mark.parametrize(
    ("device_name", "dtype", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H100 NVL", "fp16", 835.5),
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "tf32", 156.0),
        ("NVIDIA L4", "fp32", 30.3),
        ("NVIDIA A10G", "bf16", 125.0),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("Tesla V100S-PCIE-32GB", "fp16", 130.0),
        ("Tesla T4", "fp16", 65.0),
    ],
)
def test_peak_flops_of_known_gpus(device_name, dtype, tflops):
    assert peak_flops(device_name, dtype).tflops == tflops


@pytest.mark.parametrize(
    ("device_name", "dtype"),
    [("NVIDIA L40S", "bf16"), ("NVIDIA GH200 480GB", "bf16"), ("Tesla T4", "bf16"), ("cpu", "fp32")],
)
def test_unknown_gpu_or_unsupported_dtype_has_no_peak(device_name, dtype):
    assert peak_flops(device_name, dtype) is None


def test_peak_tflops_flag_overrides_the_table():
    peak = peak_flops("NVIDIA H100 80GB HBM3", "bf16", override_tflops=500.0)
    assert (peak.tflops, peak.source) == (500.0, "--peak_tflops")


def test_mfu_is_achieved_over_peak():
    peak = peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert mfu(855_166_464, 100_000.0, peak) == pytest.approx(855_166_464 * 1e5 / 989.5e12)


def test_mfu_of_an_unknown_peak_is_unknown():
    assert mfu(855_166_464, 100_000.0, None) is None


def test_tf32_state_is_read_after_transformers_sets_it_through_the_new_api():
    from transformers.utils.import_utils import enable_tf32

    before = torch.backends.fp32_precision
    try:
        enable_tf32(True)
        assert tf32_matmuls()
        enable_tf32(False)
        assert not tf32_matmuls()
    finally:
        torch.backends.fp32_precision = before
