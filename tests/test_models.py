"""Model loading (real weights or an explicit --from_scratch), block size choice, parameter counting."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from tiny_configs import tiny_config
from transformers import AutoModelForCausalLM, GPT2Config, set_seed
from transformers.integrations import HfDeepSpeedConfig

from finetune.errors import FinetuneError
from finetune.models import (
    ZERO3_LINEAR_WARNING,
    apply_config_overrides,
    build_model,
    check_attention_implementation,
    choose_block_size,
    count_parameters,
    load_config,
    resolve_model,
)
from finetune.run_flags import ModelArguments

from launching import PROJECT_ROOT, one_process_script


def load(args):
    location = resolve_model(args.model)
    return build_model(args, load_config(args, location), location)


def test_saved_model_loads_with_its_weights(tiny_gpt2_dir):
    model = load(ModelArguments(model=str(tiny_gpt2_dir)))
    saved = load_file(tiny_gpt2_dir / "model.safetensors")
    loaded = model.state_dict()
    assert saved
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name


def test_saved_weights_load_into_the_models_own_layers_never_hub_kernels(tiny_gpt2_dir, monkeypatch):
    asked = []
    load_weights = AutoModelForCausalLM.from_pretrained

    def recording(*args, **kwargs):
        asked.append(kwargs.get("use_kernels"))
        return load_weights(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recording)
    load(ModelArguments(model=str(tiny_gpt2_dir)))
    assert asked == [False]


def test_saved_model_loads_in_fp32(tiny_gpt2_dir):
    model = load(ModelArguments(model=str(tiny_gpt2_dir)))
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_from_scratch_applies_config_overrides():
    args = ModelArguments(model="gpt2", from_scratch=True, config_overrides="n_layer=1,n_embd=32,n_head=2")
    model = load(args)
    assert model.config.n_layer == 1
    assert len(model.transformer.h) == 1
    assert model.transformer.wte.weight.shape == (50257, 32)


def test_folder_without_weights_asks_for_from_scratch():
    with pytest.raises(FinetuneError, match="--from_scratch"):
        load(ModelArguments(model="gpt2"))


def test_unknown_config_override_key_is_an_error():
    args = ModelArguments(model="gpt2", from_scratch=True, config_overrides="n_layers_typo=1")
    with pytest.raises(FinetuneError, match="n_layers_typo"):
        load_config(args, resolve_model(args.model))


@pytest.mark.parametrize(
    ("architecture", "overrides", "named"),
    [("gpt2", "n_layer=0", "n_layer must be at least 1, got 0"),
     ("gpt2", "n_embd=-64", "n_embd must be at least 1, got -64"),
     ("llama", "num_key_value_heads=0", "num_key_value_heads must be at least 1, got 0"),
     ("llama", "intermediate_size=0", "intermediate_size must be at least 1, got 0")],
)  # fmt: skip
def test_a_config_override_of_a_size_below_one_is_refused_by_its_name(architecture, overrides, named):
    """A GPT-2 of n_layer=0 or -1 built, trained and saved without a single block."""
    with pytest.raises(FinetuneError, match=f"--config_overrides '{overrides}': {named}"):
        apply_config_overrides(tiny_config(architecture), overrides)


def test_default_block_size_is_the_context_when_it_is_short():
    assert choose_block_size(None, GPT2Config(n_positions=128)) == 128


def test_default_block_size_is_capped_at_1024():
    assert choose_block_size(None, GPT2Config(n_positions=4096)) == 1024


def test_requested_block_size_within_the_context_is_kept():
    assert choose_block_size(64, GPT2Config(n_positions=128)) == 64


def test_block_size_larger_than_the_context_is_an_error():
    with pytest.raises(FinetuneError, match="context"):
        choose_block_size(256, GPT2Config(n_positions=128))


def test_count_parameters_counts_tied_embeddings_once():
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=100)
    model = AutoModelForCausalLM.from_config(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    embeddings = 100 * 32 + 16 * 32  # wte, wpe
    layer = (
        2 * 32  # ln_1
        + 32 * 96 + 96  # attn.c_attn
        + 32 * 32 + 32  # attn.c_proj
        + 2 * 32  # ln_2
        + 32 * 128 + 128  # mlp.c_fc
        + 128 * 32 + 32  # mlp.c_proj
    )  # fmt: skip
    final_norm = 2 * 32  # ln_f
    assert count_parameters(model) == embeddings + 1 * layer + final_norm


def test_gpt2_declares_the_causal_lm_loss_so_the_trainer_counts_shifted_tokens(data_dir):
    args = ModelArguments(model="gpt2", from_scratch=True, config_overrides="n_layer=1,n_embd=32,n_head=2")
    location = resolve_model(args.model)
    model = build_model(args, load_config(args, location), location)
    assert model.loss_type == "ForCausalLM"


ZERO3_INIT_SCRIPT = """
import json, deepspeed
from transformers import GPT2Config
from transformers.integrations.deepspeed import HfDeepSpeedConfig
from finetune.run_flags import ModelArguments
from finetune.models import build_model
from transformers import set_seed
zero3 = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
set_seed(0)
model = build_model(ModelArguments(from_scratch=True), GPT2Config(n_layer=8, n_embd=128, n_head=2), "unused")
weights = {}
for name, weight in model.named_parameters():
    with deepspeed.zero.GatheredParameters([weight]):
        weights[name] = {"std": weight.std().item(), "sum": weight.double().sum().item()}
print(json.dumps(weights))
"""


ZERO3_CONFIG = GPT2Config(n_layer=8, n_embd=128, n_head=2)


@pytest.fixture(scope="module")
def zero3_weights() -> dict[str, dict[str, float]]:
    """Spread and sum of every weight of a model built from scratch under ZeRO-3 (one process, seed 0)."""
    return one_process_script(ZERO3_INIT_SCRIPT)


@pytest.mark.integration
def test_zero3_from_scratch_keeps_gpt2s_scaled_residual_init(zero3_weights):
    """transformers' ZeRO-3 init leaves child weights it sets from a parent (GPT-2's c_proj) unscaled."""
    residual = 0.02 / math.sqrt(2 * 8)
    projections = {name: w["std"] for name, w in zero3_weights.items() if name.endswith("c_proj.weight")}
    assert len(projections) == 16
    for name, std in projections.items():
        assert std == pytest.approx(residual, rel=0.1), name
    assert zero3_weights["transformer.h.0.attn.c_attn.weight"]["std"] == pytest.approx(0.02, rel=0.1)


def test_zero3_from_scratch_starts_from_the_weights_every_other_profile_starts_from(zero3_weights):
    set_seed(0)
    model = build_model(ModelArguments(from_scratch=True), ZERO3_CONFIG, "unused")
    for name, weight in model.named_parameters():
        expected = weight.double().sum().item()
        assert zero3_weights[name]["sum"] == pytest.approx(expected, rel=1e-9, abs=1e-9), name


LINEAR_UNDER_ZERO3_SCRIPT = """
import json, sys
from transformers import LlamaConfig
from transformers.integrations.deepspeed import HfDeepSpeedConfig
from finetune.models import build_model, zero3_linear_warning
from finetune.run_flags import ModelArguments
config = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2)
warnings = []
for zero in json.loads(sys.argv[2]):  # the shipped JSON's choice first: DeepSpeed's swap is for good
    zero3 = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero})
    model = build_model(ModelArguments(from_scratch=True), config, "unused")
    warnings.append(zero3_linear_warning(model, model._no_split_modules))
print(json.dumps(warnings))
"""


@pytest.mark.integration
def test_shipped_zero3_keeps_torchs_linear_and_a_json_that_does_not_is_warned_of():
    """DeepSpeed's zero.Init swaps in its own linear unless the JSON says memory_efficient_linear:
    false (docs/profiles.md); built as run.py builds under ZeRO-3, a Llama's blocks keep torch's, and
    with DeepSpeed's default run.py prints one warning line."""
    shipped = json.loads((PROJECT_ROOT / "ds_configs" / "zero3.json").read_text())["zero_optimization"]
    choices = [
        {"stage": 3, "memory_efficient_linear": shipped["memory_efficient_linear"]},
        {"stage": 3},  # DeepSpeed's default
    ]
    assert one_process_script(LINEAR_UNDER_ZERO3_SCRIPT, json.dumps(choices)) == [None, ZERO3_LINEAR_WARNING]


def test_random_numbers_drawn_while_the_model_is_built_do_not_change_its_weights(monkeypatch):
    """ZeRO-3's partitioning draws while the model is built (on a GPU); the weights must not follow it."""
    args = ModelArguments(from_scratch=True)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2)
    set_seed(0)
    quiet = build_model(args, config, "unused").state_dict()
    build = AutoModelForCausalLM.from_config

    def drawing_build(*positional, **keywords):
        torch.rand(1000)
        return build(*positional, **keywords)

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", drawing_build)
    set_seed(0)
    drawing = build_model(args, config, "unused").state_dict()
    for name, weight in quiet.items():
        assert torch.equal(drawing[name], weight), name


def test_an_attention_kernel_the_model_class_lacks_is_refused_before_data_is_built():
    args = ModelArguments(model="gpt2", attn_implementation="flex_attention")
    with pytest.raises(
        FinetuneError, match=r"^--attn_implementation flex_attention: GPT2LMHeadModel does not support"
    ):
        check_attention_implementation(args, tiny_config("gpt2"))


def test_an_unknown_attention_kernel_is_refused_in_one_line():
    args = ModelArguments(model="gpt2", attn_implementation="fastest")
    with pytest.raises(FinetuneError) as refused:
        check_attention_implementation(args, tiny_config("gpt2"))
    assert "\n" not in str(refused.value) and '"fastest"' in str(refused.value)


def test_a_kernel_the_model_class_has_passes():
    args = ModelArguments(model="llama", attn_implementation="flex_attention")
    check_attention_implementation(args, tiny_config("llama"))


def test_the_attention_check_builds_no_zero3_partitioned_model():
    """Under ZeRO-3 transformers' from_config would partition the model (zero.Init) as it builds it."""
    zero3 = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        check_attention_implementation(ModelArguments(model="gpt2"), tiny_config("gpt2"))
    finally:
        del zero3
