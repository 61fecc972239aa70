"""The chunked loss is the model's own loss: same value and same gradients, without full logits."""

import copy
from types import SimpleNamespace

import pytest
import torch
from tiny_configs import tiny_config
from transformers import AutoModelForCausalLM

import finetune.losses
from finetune.evaluation import loss_sums_per_sample
from finetune.launched import Launch
from finetune.loss_chunks import CHUNK_LOGITS, tokens_per_chunk
from finetune.losses import (
    align_output_matmul,
    causal_lm_loss,
    chunked_loss_problem,
    compile_loss,
    next_tokens,
    use_chunked_loss,
)
from finetune.profiles import load_strategy

VOCAB = 1000  # not a multiple of the 64 the output weight is padded to


def tiny(architecture, **overrides):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(architecture, vocab_size=VOCAB, **overrides))
    model.loss_type = "ForCausalLM"
    return model.train()  # dropout is off in the configs: both models must see the same function


TINY_MODELS = {
    "gpt2": lambda: tiny("gpt2", bos_token_id=0, eos_token_id=0),
    "llama": lambda: tiny("llama", tie_word_embeddings=False),
}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 7 tokens, so every test crosses chunk boundaries."""
    monkeypatch.setattr(finetune.losses, "tokens_per_chunk", lambda device_type, vocab, width: 7)


def batch_with_ignored_labels():
    torch.manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (3, 20))
    labels = input_ids.clone()
    labels[0, :6] = -100
    labels[2, 15:] = -100
    return input_ids, labels


def loss_and_gradients(model, input_ids, labels, num_items_in_batch=None):
    model.zero_grad()
    loss = model(input_ids=input_ids, labels=labels, num_items_in_batch=num_items_in_batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", sorted(TINY_MODELS))
@pytest.mark.parametrize("num_items_in_batch", [None, 50])
def test_loss_and_gradients_equal_the_models_own(family, num_items_in_batch):
    own = TINY_MODELS[family]()
    chunked = use_chunked_loss(copy.deepcopy(own))
    input_ids, labels = batch_with_ignored_labels()
    expected_loss, expected_grads = loss_and_gradients(own, input_ids, labels, num_items_in_batch)
    loss, grads = loss_and_gradients(chunked, input_ids, labels, num_items_in_batch)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_labels_shifted_before_a_split_give_the_models_own_loss_and_gradients():
    """A sequence split over ranks brings its labels already shifted (`shift_labels`; a slice's last
    one is the first token of the next slice): the chunked loss takes them as given, as the model's
    own loss does, and not the labels shifted inside the slice."""
    own = TINY_MODELS["llama"]()
    chunked = use_chunked_loss(copy.deepcopy(own))
    input_ids, labels = batch_with_ignored_labels()
    shift_labels = torch.randint(0, VOCAB, labels.shape)
    shift_labels[1, :4] = -100
    results = []
    for model in (own, chunked):
        model.zero_grad()
        output = model(input_ids=input_ids, labels=labels, shift_labels=shift_labels, num_items_in_batch=40)
        output.loss.backward()
        results.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name, grad in results[0].items():
        torch.testing.assert_close(results[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_given_shift_labels_are_not_shifted_again():
    torch.manual_seed(2)
    hidden, weight = torch.randn(1, 6, 8), torch.randn(VOCAB, 8)
    targets = torch.randint(0, VOCAB, (1, 6))
    given = causal_lm_loss(hidden, weight, targets, shift_labels=targets)
    logits = (hidden @ weight.T).reshape(-1, VOCAB)
    torch.testing.assert_close(given, torch.nn.functional.cross_entropy(logits, targets.reshape(-1)))


def test_training_forward_returns_no_logits():
    model = use_chunked_loss(TINY_MODELS["gpt2"]())
    input_ids, labels = batch_with_ignored_labels()
    assert model(input_ids=input_ids, labels=labels).logits is None


@pytest.mark.parametrize("family", sorted(TINY_MODELS))
def test_evaluation_gives_the_loss_and_per_sample_sums_the_models_logits_give(family):
    """Evaluation never holds the block's logits either: the metric's per-sample loss sums and token
    counts come from the chunks, and pass through loss_sums_per_sample unchanged."""
    own = TINY_MODELS[family]().eval()
    chunked = use_chunked_loss(copy.deepcopy(own)).eval()
    input_ids, labels = batch_with_ignored_labels()
    with torch.no_grad():
        expected, output = (
            own(input_ids=input_ids, labels=labels),
            chunked(input_ids=input_ids, labels=labels),
        )
    assert output.logits.shape == (3, 2)  # the sums, not [batch, tokens, vocabulary]
    torch.testing.assert_close(output.loss, expected.loss, rtol=1e-6, atol=1e-6)
    sums = loss_sums_per_sample(output.logits, labels)
    torch.testing.assert_close(sums, loss_sums_per_sample(expected.logits, labels), rtol=1e-6, atol=1e-6)


def test_evaluation_of_a_split_sequence_and_generation_keep_the_models_logits():
    model = use_chunked_loss(TINY_MODELS["llama"]()).eval()
    input_ids, labels = batch_with_ignored_labels()
    assert model(input_ids=input_ids).logits.shape == (3, 20, VOCAB)
    split = model(input_ids=input_ids, labels=labels, shift_labels=labels)
    assert split.logits.shape == (3, 20, VOCAB)


def test_bf16_autocast_loss_is_close_to_the_fp32_loss():
    model = TINY_MODELS["gpt2"]()
    hidden = torch.randn(2, 9, 32)
    labels = torch.randint(0, VOCAB, (2, 9))
    weight = model.get_output_embeddings().weight
    exact = causal_lm_loss(hidden, weight, labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low_precision = causal_lm_loss(hidden, weight, labels)
    assert low_precision.dtype == torch.float32
    torch.testing.assert_close(low_precision, exact, rtol=1e-2, atol=0)


def test_models_outside_the_tested_families_keep_their_own_loss():
    from transformers import OPTConfig

    model = AutoModelForCausalLM.from_config(
        OPTConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            ffn_dim=32,
            num_attention_heads=2,
            word_embed_proj_dim=16,
        )
    )
    assert "model type opt" in chunked_loss_problem(model, load_strategy("ddp"))
    assert chunked_loss_problem(TINY_MODELS["gpt2"](), load_strategy("ddp")) is None


def test_every_zero3_profile_keeps_the_models_own_loss_in_training():
    model = TINY_MODELS["gpt2"]()
    for name in ("zero3", "zero3_offload", "zero3_nvme"):
        assert "ZeRO-3" in chunked_loss_problem(model, load_strategy(name)), name
    for name in ("single", "ddp", "zero1", "zero2", "fsdp", "fsdp_grad_op"):
        assert chunked_loss_problem(model, load_strategy(name)) is None, name


def test_under_zero3_training_keeps_the_models_loss_and_evaluation_is_chunked():
    """ZeRO-3 reduces the output weight's gradient from its own module's forward: training keeps the
    model's loss; evaluation needs no gradient and gathers the weight itself (a no-op on a weight
    ZeRO-3 does not partition, as here; the 2-rank run in tests/test_integration.py gathers it)."""
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    from finetune.converters import chunked_loss

    model = TINY_MODELS["gpt2"]()  # built before, or transformers would build it partitioned
    zero3 = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    try:
        launch = Launch(load_strategy("zero3"))
        model, _ = chunked_loss(model, None, SimpleNamespace(process_index=0), launch, "fp32")
        input_ids, labels = batch_with_ignored_labels()
        assert model(input_ids=input_ids, labels=labels).logits.shape == (3, 20, VOCAB)
        with torch.no_grad():
            assert model.eval()(input_ids=input_ids, labels=labels).logits.shape == (3, 2)
    finally:
        unset_hf_deepspeed_config()
        del zero3


def test_a_compiled_model_computes_the_chunked_loss_outside_the_graph(monkeypatch):
    calls_while_compiling = []
    chunk_loss = finetune.losses._chunk_loss_and_grad

    def recording(*args):
        calls_while_compiling.append(torch.compiler.is_compiling())
        return chunk_loss(*args)

    monkeypatch.setattr(finetune.losses, "_chunk_loss_and_grad", recording)
    model = use_chunked_loss(TINY_MODELS["gpt2"]())
    input_ids, labels = batch_with_ignored_labels()
    torch.compile(model, backend="eager")(input_ids=input_ids, labels=labels).loss.backward()
    assert calls_while_compiling and not any(calls_while_compiling)


def test_aligned_output_matmul_gives_the_models_own_logits_and_gradients():
    own, aligned = TINY_MODELS["gpt2"](), TINY_MODELS["gpt2"]()
    assert align_output_matmul(aligned)
    ids = torch.randint(0, VOCAB, (2, 16))
    own_out, aligned_out = own(input_ids=ids, labels=ids), aligned(input_ids=ids, labels=ids)
    assert aligned_out.logits.shape == own_out.logits.shape == (2, 16, VOCAB)
    torch.testing.assert_close(aligned_out.logits, own_out.logits)
    own_out.loss.backward()
    aligned_out.loss.backward()
    for (name, p), q in zip(own.named_parameters(), aligned.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_aligned_output_layer_keeps_its_tied_weight_and_state_dict():
    own, aligned = TINY_MODELS["gpt2"](), TINY_MODELS["gpt2"]()
    align_output_matmul(aligned)
    assert aligned.lm_head.weight is aligned.transformer.wte.weight
    assert aligned.state_dict().keys() == own.state_dict().keys()
    assert copy.deepcopy(aligned).lm_head(torch.randn(3, 32)).shape == (3, VOCAB)


def test_an_aligned_vocabulary_is_left_alone():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt2", vocab_size=1024, n_layer=1))
    assert not align_output_matmul(model)
    assert type(model.lm_head) is torch.nn.Linear


@pytest.mark.parametrize("family", sorted(TINY_MODELS))
def test_compiled_loss_gives_the_models_own_loss_and_gradients(family):
    own = TINY_MODELS[family]()
    compiled = copy.deepcopy(own)
    compile_loss(compiled)
    input_ids, labels = batch_with_ignored_labels()
    expected_loss, expected_grads = loss_and_gradients(own, input_ids, labels, 50)
    loss, grads = loss_and_gradients(compiled, input_ids, labels, 50)
    assert compiled.loss_function is not own.loss_function
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_loss_under_adapters_replaces_the_base_models_loss():
    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(TINY_MODELS["gpt2"](), LoraConfig(r=2, target_modules=["c_attn"]))
    own_loss = adapted.get_base_model().loss_function
    compile_loss(adapted)
    assert adapted.get_base_model().loss_function is not own_loss
    input_ids, labels = batch_with_ignored_labels()
    assert torch.isfinite(adapted(input_ids=input_ids, labels=labels).loss)


def test_a_gpus_chunk_stays_the_one_the_planners_calibration_measured():
    """The planner counts the chunk through the same function; its long-block rows ran 2^26 logits."""
    assert tokens_per_chunk("cuda", 50304, 1024) == CHUNK_LOGITS // 50304


def test_a_cpus_chunk_keeps_its_logits_below_mallocs_largest_mmap_threshold():
    """On CPU a chunk's fp32 buffers above glibc's mmap threshold (32 MiB at most) are mapped and
    unmapped each step, faulting their pages in again."""
    assert tokens_per_chunk("cpu", 50304, 64) * 50304 * 4 <= 16 * 2**20


def test_a_cpus_chunk_is_at_least_half_the_width_in_tokens():
    """Each chunk reads the whole output weight three times: wide models take longer chunks."""
    assert tokens_per_chunk("cpu", 50304, 1600) == 800


def test_labels_are_shifted_to_the_next_token_with_the_last_ignored():
    labels = torch.tensor([[5, 6, 7, -100], [1, 2, 3, 4]])
    expected = torch.tensor([[6, 7, -100, -100], [2, 3, 4, -100]])
    assert torch.equal(next_tokens(labels), expected)
