"""--fp8: which layers multiply in float8, that the saved model stays the model's own, and where it is
refused. Float8 matmuls run on CPU too (torch._scaled_mm), slowly: these runs are real."""

from __future__ import annotations

import copy
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torchao.float8 import Float8LinearConfig
from torchao.float8.float8_linear import Float8Linear
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.pytorch_utils import Conv1D

from finetune.arguments import parse_arguments
from finetune.converters import refuse_incompatible
from finetune.errors import FinetuneError
from finetune.fp8 import Float8Conv1D, check_float8_gpu, convert_to_float8
from finetune.launched import Launch
from finetune.summary import read_summary

from launching import PROJECT_ROOT, TINY_MODEL, accelerate_launch, launch

QUIET = ["--report_to", "none", "--save_strategy", "no"]
# On CPU torch._scaled_mm's time grows with the tokens and dwarfs the rest of a step: few short blocks,
# and a learning rate at which 6 steps lower the loss plainly.
SHORT_RUN = [
    *TINY_MODEL, "--fp8", "--max_steps", "6", "--batch_size", "2", "--block_size", "32",
    "--learning_rate", "3e-3", "--logging_steps", "2", "--max_eval_samples", "4",
]  # fmt: skip


def tiny_gpt2(n_embd: int = 64) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=n_embd, n_head=2, vocab_size=101, n_positions=32))


def test_every_projection_of_gpt2_multiplies_in_float8_but_the_output_layer():
    model = tiny_gpt2()
    assert convert_to_float8(model) == 2 * 4  # per block: attention in and out, MLP in and out
    assert all(type(module) is not Conv1D for module in model.modules())
    assert type(model.lm_head) is torch.nn.Linear


def test_every_linear_layer_of_a_llama_multiplies_in_float8_but_the_output_layer():
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=101
    )
    model = LlamaForCausalLM(config)
    assert convert_to_float8(model) == 2 * 7  # q, k, v, o, gate, up, down
    assert type(model.lm_head) is torch.nn.Linear
    assert sum(isinstance(module, Float8Linear) for module in model.modules()) == 2 * 7


def test_layers_whose_sides_are_not_multiples_of_16_stay_as_they_are():
    model = tiny_gpt2(n_embd=40)  # 40 is not a multiple of 16: no projection qualifies
    assert convert_to_float8(model) == 0
    assert sum(type(module) is Conv1D for module in model.modules()) == 2 * 4


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).detach().norm() / reference.detach().norm())


def test_a_float8_conv1d_keeps_the_layers_weights_and_its_product_and_gradients_to_float8_precision():
    torch.manual_seed(0)
    conv = Conv1D(64, 32)  # 32 inputs, 64 outputs; the weight is stored 32 x 64
    torch.nn.init.normal_(conv.bias)
    reference = copy.deepcopy(conv)
    inputs = torch.randn(4, 8, 32, requires_grad=True)
    reference_inputs = inputs.detach().clone().requires_grad_()
    upstream = torch.randn(4, 8, 64)
    expected = reference(reference_inputs)
    expected.backward(upstream)
    layer = Float8Conv1D.from_conv1d(conv, Float8LinearConfig())
    assert layer.weight is conv.weight and layer.bias is conv.bias
    assert layer.state_dict().keys() == conv.state_dict().keys()
    output = layer(inputs)
    output.backward(upstream)
    # float8 rounds (e4m3 forward, e5m2 for the gradients): close, not exact
    assert 0 < relative_error(output, expected) < 0.1
    assert 0 < relative_error(inputs.grad, reference_inputs.grad) < 0.1
    assert 0 < relative_error(conv.weight.grad, reference.weight.grad) < 0.1


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def fp8_run(request, tmp_path_factory) -> tuple[Path, str]:
    """A short --fp8 run on 2 ranks: its output folder and what it printed, read by the tests below."""
    output_dir = tmp_path_factory.mktemp(f"fp8-{request.param}") / "out"
    result = launch(accelerate_launch(request.param), output_dir, [*SHORT_RUN, *QUIET])
    return output_dir, result.stdout + result.stderr


@pytest.mark.integration
def test_fp8_trains_on_two_ranks(fp8_run):
    output_dir, printed = fp8_run
    summary = read_summary(output_dir)
    assert (summary["world_size"], summary["fp8_layers"]) == (2, 2 * 4)
    assert "(float8 matmuls in 8 layers)" in printed
    losses = [point["loss"] for point in summary["loss_curve"]]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]


@pytest.mark.integration
def test_a_run_with_fp8_saves_a_model_without_float8_layers(fp8_run):
    output_dir, _ = fp8_run
    saved = AutoModelForCausalLM.from_pretrained(output_dir)
    assert any(type(module) is Conv1D for module in saved.modules())
    weights = load_file(output_dir / "model.safetensors")
    assert weights["transformer.h.0.mlp.c_fc.weight"].shape == (64, 256)  # Conv1D's in x out


def test_fp8_with_peft_is_one_error(output_flags):
    model_args, _, training_args = parse_arguments(
        [*output_flags, "--model", "gpt2", "--fp8", "--peft", "lora"]
    )
    with pytest.raises(FinetuneError, match="--fp8 is for full fine-tuning"):
        refuse_incompatible(model_args, training_args)


def test_fp8_under_a_deepspeed_profile_is_one_error(output_flags, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(PROJECT_ROOT / "ds_configs" / "zero2.json"))
    model_args, _, training_args = parse_arguments([*output_flags, "--fp8"])
    with pytest.raises(FinetuneError, match="--fp8 runs under single, ddp and the FSDP profiles"):
        refuse_incompatible(model_args, training_args, Launch.from_environment())


def test_fp8_without_torchao_is_one_error_saying_how_to_install_it(output_flags, monkeypatch):
    real_find_spec = importlib.util.find_spec

    def without_torchao(name: str, *rest):
        return None if name == "torchao" else real_find_spec(name, *rest)

    monkeypatch.setattr(importlib.util, "find_spec", without_torchao)
    with pytest.raises(FinetuneError, match=r"--fp8 needs torchao: pip install 'finetune\[fp8\]'"):
        parse_arguments([*output_flags, "--fp8"])


def test_a_gpu_that_cannot_multiply_in_float8_is_one_error_naming_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(
        FinetuneError, match=r"compute capability 8\.9 or newer.*NVIDIA A100-SXM4-80GB is 8\.0"
    ):
        check_float8_gpu()


def test_finetune_run_refuses_fp8_with_peft_before_launching(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "finetune", "run", "--profile", "single", "--fp8", "--peft", "lora",
         "--output_dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("finetune: error: --fp8 is for full fine-tuning")
