"""LoRA and DoRA through peft (`--peft`): what is adapted and trained, what checkpoints hold, export,
resume, the planner's and MFU's account of frozen weights, and one real 2-rank run per profile.

The in-process runs train a saved tiny GPT-2 (adapters need loaded weights) on one CPU process.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_configs import tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config

from finetune import run
from finetune.activation_memory import CALIBRATION_KINDS, adapter_activation_gib, adapter_input_bytes
from finetune.adapters import (
    ALL_LINEAR,
    adapted_layer_sizes,
    adapter_config,
    adapter_flags,
    add_adapters,
    check_adapters,
    narrowest_adapted_width,
    trainable_parameters,
)
from finetune.arguments import parse_arguments
from finetune.checkpoint import read_manifest
from finetune.compare import read_rows, training_variants, variant_flags
from finetune.errors import FinetuneError
from finetune.export import export_checkpoint
from finetune.flops import flops_per_token, model_flops_per_token
from finetune.layout import ParallelLayout
from finetune.memory_model import BACKWARD_END, BACKWARD_START, Calibration, estimate
from finetune.planner import run_workload
from finetune.profiles import load_strategy
from finetune.summary import read_summary
from finetune.workload import ModelShape, Workload

from launching import (
    BYTE_GPT2,
    ENVIRONMENT,
    LAUNCH_TIMEOUT_S,
    PROJECT_ROOT,
    accelerate_launch,
    launch,
    nvme_flags,
    undo_what_commands_install,
)

RANK = 4
STEPS = 4
GIB = 2**30

# adapted layers of 60 input and 40 output features in all (r·(in + out) = 200 parameters at rank 2)
ADAPTED_SHAPE = ModelShape(
    "tiny", parameters=1000, layers=1, hidden=8, vocab=10, adapted_in_out=100, adapted_out=40
)


def gpt2(layers: int = 2, width: int = 64) -> AutoModelForCausalLM:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=2, n_positions=128, vocab_size=50257)
    return AutoModelForCausalLM.from_config(config)


def lora_flags(*extra: str) -> dict:
    model_args, _, _ = parse_arguments(["--peft", "lora", "--lora_rank", str(RANK), *extra])
    return adapter_flags(model_args)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A saved tiny byte-level GPT-2 (random weights, no dropout): the base every run here adapts."""
    folder = tmp_path_factory.mktemp("lora-base")
    torch.manual_seed(0)
    config = GPT2Config.from_pretrained(BYTE_GPT2, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(BYTE_GPT2).save_pretrained(folder)
    return folder


def run_flags(base: Path, text: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--model", str(base), "--peft", "lora", "--lora_rank", str(RANK), "--lora_dropout", "0",
        "--dataset", str(text), "--block_size", "64", "--max_steps", str(STEPS), "--batch_size", "4",
        "--learning_rate", "3e-3", "--max_eval_samples", "8", "--logging_steps", "1", "--report_to", "none",
        "--disable_tqdm", "true", *extra, "--output_dir", str(output_dir),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora-data") / "train.txt"
    path.write_text("\n".join(f"line {i} of a small corpus that the adapters learn." for i in range(400)))
    return path


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, base_dir, corpus):
    """One finished single-process LoRA run with checkpoints at steps 2 and 4; read, never written."""
    output_dir = tmp_path_factory.mktemp("lora-run") / "out"
    with pytest.MonkeyPatch.context() as patch:  # what the run installs process-wide stays in it
        undo_what_commands_install(patch)
        run.main(
            run_flags(base_dir, corpus, output_dir, "--save_steps", "2", "--generation_prompt", "line 3")
        )
    return output_dir


def test_adapter_defaults_are_rank_16_lora_on_all_linear_layers():
    model_args, _, _ = parse_arguments(["--peft", "lora"])
    config = adapter_config(adapter_flags(model_args))
    assert (config.r, config.lora_alpha, config.lora_dropout) == (16, 32, 0.05)
    assert config.target_modules == "all-linear"
    assert not config.use_dora


def test_dora_is_lora_with_weight_decomposition():
    model_args, _, _ = parse_arguments(["--peft", "dora"])
    assert adapter_config(adapter_flags(model_args)).use_dora


def test_full_fine_tuning_records_no_adapter():
    model_args, _, _ = parse_arguments([])
    assert adapter_flags(model_args) == {"peft": None}


def test_peft_from_scratch_is_refused():
    with pytest.raises(FinetuneError, match="--from_scratch"):
        parse_arguments(["--peft", "lora", "--from_scratch"])


def test_default_targets_every_gpt2_conv1d_layer_but_not_the_output_layer():
    model = add_adapters(gpt2(), lora_flags(), "fp32")
    adapted = {
        name.split("base_model.model.")[1] for name, m in model.named_modules() if hasattr(m, "lora_A")
    }
    expected = {f"transformer.h.{i}.{layer}" for i in range(2) for layer in ("attn.c_attn", "attn.c_proj")}
    expected |= {f"transformer.h.{i}.{layer}" for i in range(2) for layer in ("mlp.c_fc", "mlp.c_proj")}
    assert adapted == expected


def test_default_targets_every_llama_projection_but_not_the_output_layer():
    config = tiny_config("llama", num_hidden_layers=1, vocab_size=128)
    model = add_adapters(AutoModelForCausalLM.from_config(config), lora_flags(), "fp32")
    adapted = {name.rsplit(".", 1)[1] for name, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.mark.parametrize("targets", ["q_proj,v_proj", "c_attn,q_proj"])
def test_a_target_module_no_linear_layer_has_is_one_error_listing_the_layers_it_has(targets):
    with pytest.raises(
        FinetuneError, match=r"is named q_proj; its linear layers: c_attn, c_proj, c_fc, lm_head"
    ):
        add_adapters(gpt2(), lora_flags("--lora_target_modules", targets), "fp32")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [(["--lora_target_modules", "q_proj"], "--lora_target_modules q_proj: no linear layer"),
     (["--lora_rank", "65"], "--lora_rank 65 is above 64, the narrower side")],
    ids=["target_no_layer_has", "rank_above_the_narrowest_layer"],
)  # fmt: skip
def test_adapter_flags_the_model_cannot_take_stop_a_run_before_reading_data(
    flags, expected, base_dir, tmp_path, capsys
):
    argv = ["--model", str(base_dir), "--peft", "lora", *flags,
            "--dataset", str(tmp_path / "never-read.txt"), "--output_dir", str(tmp_path / "out")]  # fmt: skip
    with pytest.raises(SystemExit):
        run.main(argv)
    assert f"finetune: error: {expected}" in capsys.readouterr().err


def test_the_narrowest_adapted_width_is_of_the_named_layers_only():
    model = gpt2()  # width 64, MLP 256: every layer's narrower side is 64
    assert narrowest_adapted_width(model) == narrowest_adapted_width(model, "c_fc") == 64
    check_adapters(model, ALL_LINEAR, 64)  # a full-rank update is allowed


def test_a_plan_with_a_rank_above_the_models_width_is_refused():
    with pytest.raises(FinetuneError, match=r"--lora_rank 1000 is above 768"):
        run_workload(*parse_arguments(["--model", "gpt2", "--peft", "lora", "--lora_rank", "1000"]))


def test_planner_counts_the_adapters_of_the_named_target_modules_only():
    model = gpt2()
    attention_only, _ = adapted_layer_sizes(model, "c_attn")
    assert attention_only == 2 * (64 + 192)  # two layers' c_attn, 64 in and 192 out
    assert adapted_layer_sizes(model, "attn.c_proj")[0] == 2 * (64 + 64)
    assert adapted_layer_sizes(model, "c_proj")[0] == 2 * (64 + 64) + 2 * (
        256 + 64
    )  # attention's and the MLP's


def test_plan_of_targeted_lora_predicts_less_than_of_all_linear_lora():
    flags = ["--model", "gpt2", "--peft", "lora"]
    shape_all, _ = run_workload(*parse_arguments(flags))
    shape_few, _ = run_workload(*parse_arguments([*flags, "--lora_target_modules", "c_attn"]))
    assert shape_few.adapter_parameters("lora", 16) < shape_all.adapter_parameters("lora", 16)
    assert shape_few.adapter_parameters("lora", 16) == 16 * 12 * (768 + 3 * 768)


def test_a_lora_alpha_that_scales_every_update_away_is_refused():
    with pytest.raises(FinetuneError, match=r"^--lora_alpha must be positive, got 0.0$"):
        parse_arguments(["--peft", "lora", "--lora_alpha", "0"])


def test_only_the_adapters_are_trainable():
    model = add_adapters(gpt2(layers=2, width=64), lora_flags(), "fp32")
    in_out_per_layer = (
        (64 + 192) + (64 + 64) + (64 + 256) + (256 + 64)
    )  # c_attn, attn c_proj, c_fc, mlp c_proj
    assert trainable_parameters(model) == RANK * in_out_per_layer * 2
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in name for name in trained)


def test_frozen_base_is_kept_in_the_compute_dtype_and_adapters_in_fp32():
    model = add_adapters(gpt2(), lora_flags(), "bf16")
    dtypes = {p.requires_grad: p.dtype for p in model.parameters()}
    assert dtypes == {False: torch.bfloat16, True: torch.float32}


def test_planner_counts_the_same_adapters_peft_adds():
    shape = ModelShape.from_config("tiny", gpt2().config)
    model = add_adapters(gpt2(), lora_flags(), "fp32")
    assert shape.adapter_parameters("lora", RANK) == trainable_parameters(model)


def test_planner_keeps_gradients_and_optimizer_states_for_the_adapters_only():
    workload = Workload(1, 8, "bf16", peft="lora", lora_rank=2)  # 200 adapter parameters
    no_activations = Calibration(dict.fromkeys(CALIBRATION_KINDS, 0.0))
    ddp = estimate(load_strategy("ddp"), ADAPTED_SHAPE, workload, ParallelLayout(2), no_activations)
    # torch autocast: base 1000 x 2 bytes (bf16, frozen), adapters fp32 4 + 4 gradients + 8 Adam, and
    # DDP's buckets a second copy of the adapters' gradients (at the backward's end, every gradient made)
    parameters, gradients, optimizer, _ = ddp.phases[BACKWARD_END]
    assert (parameters * GIB, gradients * GIB, optimizer * GIB) == (2800, 800 + 800, 1600)
    zero3 = estimate(load_strategy("zero3"), ADAPTED_SHAPE, workload, ParallelLayout(2), no_activations)
    # DeepSpeed: adapters 2 + 2 + 12 bytes; everything sharded over the 2 GPUs, beside ZeRO-3's
    # gradient reduce buffer of reduce_bucket_size bf16 values, whatever is trained, and the frozen
    # base's weights gathered whole for the backward (1000 x 2 bytes, within its reuse distance)
    buffer = load_strategy("zero3").reduce_bucket_values * 2
    parameters, gradients, optimizer, _ = zero3.phases[BACKWARD_START]
    states = (parameters * GIB, gradients * GIB, optimizer * GIB)
    assert states == pytest.approx((1200 + 2000, 200 + buffer, 1200))


def test_dora_adds_one_magnitude_per_adapted_output():
    assert ADAPTED_SHAPE.adapter_parameters("dora", 2) - ADAPTED_SHAPE.adapter_parameters("lora", 2) == 40


@pytest.mark.parametrize(
    ("profile", "output_bytes"), [("single", 4), ("fsdp", 4), ("zero2", 4), ("zero3", 8)]
)
def test_dora_keeps_each_adapted_layers_two_outputs_beyond_loras_activations(profile, output_bytes):
    """The frozen layer's output and the adapter's, kept for the magnitude's gradient, in the
    adapter's output dtype: bf16 but under ZeRO-3, whose adapters stay fp32 (eager here)."""
    lora = Workload(4, 64, "bf16", compiled=False, peft="lora", lora_dropout=0.0)
    dora = Workload(4, 64, "bf16", compiled=False, peft="dora", lora_dropout=0.0)
    strategy = load_strategy(profile)
    with_dora = adapter_activation_gib(ADAPTED_SHAPE, dora, strategy)
    extra = with_dora - adapter_activation_gib(ADAPTED_SHAPE, lora, strategy)
    assert extra * GIB == pytest.approx(4 * 64 * 40 * output_bytes)


def test_zero1_and_zero2_adapters_are_bf16_like_their_input_and_zero3s_are_cast_to():
    """DeepSpeed casts a ZeRO-1/2 model's parameters to bf16 at set-up, the adapters too: no cast copy
    of their input, as under FSDP2; ZeRO-3's partitioned model keeps them fp32 as peft made them."""
    eager = Workload(4, 64, "bf16", compiled=False, peft="lora")
    cast = {
        name: adapter_input_bytes(load_strategy(name), eager, ADAPTED_SHAPE)
        for name in ("fsdp", "zero1", "zero2", "zero3")
    }
    assert cast["zero1"] == cast["zero2"] == cast["fsdp"] == 0
    assert cast["zero3"] > 0


def test_a_frozen_weight_counts_4_flops_per_token_not_6():
    assert flops_per_token(100, 1, 8, 4, frozen_matmul_params=60) == 6 * 40 + 4 * 60 + 12 * 8 * 4


def test_mfu_of_a_lora_model_counts_its_frozen_base_at_4_flops():
    full = gpt2()
    full_flops = model_flops_per_token(full, full.config, 64)
    model = add_adapters(gpt2(), lora_flags(), "fp32")
    adapters = trainable_parameters(model)
    base_matmuls = (full_flops - 12 * 2 * 64 * 64) // 6
    assert model_flops_per_token(model, full.config, 64) == 4 * base_matmuls + 6 * adapters + 12 * 2 * 64 * 64


def test_compare_runs_each_profile_full_and_with_lora():
    variants = training_variants("full,lora", [])
    assert [variant_flags(variant) for variant in variants] == [[], ["--peft", "lora"]]


def test_compare_refuses_peft_both_as_variants_and_in_run_flags():
    with pytest.raises(FinetuneError, match=r"give --variants .* or --peft in the run flags, not both"):
        training_variants("full,lora", ["--peft", "dora"])


def test_run_summary_records_trainable_and_total_parameters(lora_run, base_dir):
    summary = read_summary(lora_run)
    model = add_adapters(AutoModelForCausalLM.from_pretrained(base_dir), lora_flags(), "fp32")
    assert summary["peft"] == "lora"
    assert summary["trainable_parameters"] == trainable_parameters(model)
    assert summary["parameters"] == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def test_a_generation_prompt_after_lora_training_completes_from_the_adapter_folder(lora_run):
    summary = read_summary(lora_run)
    assert summary["status"] == "completed"
    assert [generation["prompt"] for generation in summary["generations"]] == ["line 3"]


def test_eval_and_generate_take_a_lora_runs_output_dir(
    lora_run, base_dir, corpus, capsys, in_process_commands
):
    """They load the base the adapter folder names and merge the adapters, as peft does."""
    from peft import PeftModel

    from finetune import cli

    eval_flags = ["--dataset", str(corpus), "--block_size", "64", "--max_tokens", "512"]
    assert cli.main(["eval", str(lora_run), *eval_flags]) == 0
    assert cli.main(["eval", str(base_dir), *eval_flags]) == 0
    adapted, base = (json.loads(line)["loss"] for line in capsys.readouterr().out.splitlines()[-2:])
    assert adapted < base  # the adapters, not the base alone
    assert cli.main(["generate", str(lora_run), "--prompt", "line 3", "--max_new_tokens", "4"]) == 0
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), lora_run)
    assert capsys.readouterr().out.strip() and merged is not None


def test_an_adapter_folder_whose_base_is_not_here_is_one_line(
    lora_run, tmp_path, capsys, in_process_commands
):
    from finetune import cli

    moved = tmp_path / "adapters"
    shutil.copytree(lora_run, moved, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    config = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "/gone"}))
    with pytest.raises(SystemExit) as stopped:
        cli.main(["generate", str(moved), "--prompt", "x", "--max_new_tokens", "2"])
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "holds adapters trained on '/gone', not found here" in lines[0]


def test_checkpoint_holds_only_the_adapters_and_says_so(lora_run):
    checkpoint = lora_run / "checkpoint-4"
    tensors = load_file(checkpoint / "adapter_model.safetensors")
    assert tensors and all("lora_" in name for name in tensors)
    assert not list(checkpoint.glob("model*.safetensors"))
    assert "adapters only" in read_manifest(checkpoint)["weights"]


def test_export_writes_an_adapter_folder_peft_loads(lora_run, base_dir, tmp_path, in_process_commands):
    from peft import PeftModel

    export_checkpoint(lora_run / "checkpoint-4", tmp_path / "adapters")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "adapters")
    saved = load_file(lora_run / "adapter_model.safetensors")
    exported = load_file(tmp_path / "adapters" / "adapter_model.safetensors")
    assert saved.keys() == exported.keys()
    assert all(torch.equal(saved[name], exported[name]) for name in saved)
    assert any("lora_B" in name and p.abs().sum() > 0 for name, p in model.named_parameters())


def test_merged_export_computes_the_adapted_models_logits(lora_run, base_dir, tmp_path, in_process_commands):
    from peft import PeftModel

    export_checkpoint(lora_run / "checkpoint-4", tmp_path / "adapters")
    export_checkpoint(lora_run / "checkpoint-4", tmp_path / "merged", merge=True)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "adapters")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    vocabulary = merged.config.vocab_size
    tokens = torch.randint(0, vocabulary, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = adapted.eval()(tokens).logits, merged.eval()(tokens).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_merge_of_a_full_fine_tuning_checkpoint_is_refused(lora_run, tmp_path, in_process_commands):
    checkpoint = shutil.copytree(lora_run / "checkpoint-4", tmp_path / "checkpoint-4")
    manifest = read_manifest(checkpoint)
    manifest["run"]["flags"]["peft"] = None
    (checkpoint / "finetune_checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(FinetuneError, match="not from a --peft run"):
        export_checkpoint(checkpoint, tmp_path / "merged", merge=True)


@pytest.mark.integration
def test_resumed_lora_run_ends_with_the_uninterrupted_adapters(
    lora_run, base_dir, corpus, tmp_path, in_process_commands
):
    output_dir = tmp_path / "resumed"
    shutil.copytree(lora_run / "checkpoint-2", output_dir / "checkpoint-2")
    run.main(run_flags(base_dir, corpus, output_dir, "--save_strategy", "no", "--resume"))
    assert read_summary(output_dir)["resumed_from_step"] == 2
    uninterrupted = load_file(lora_run / "adapter_model.safetensors")
    resumed = load_file(output_dir / "adapter_model.safetensors")
    assert uninterrupted.keys() == resumed.keys()
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6)


def test_resume_as_full_fine_tuning_is_refused(lora_run, base_dir, corpus, tmp_path, capsys):
    output_dir = tmp_path / "resumed"
    shutil.copytree(lora_run / "checkpoint-2", output_dir / "checkpoint-2")
    flags = run_flags(base_dir, corpus, output_dir, "--resume")
    del flags[flags.index("--peft") : flags.index("--dataset")]  # --peft and the LoRA settings
    with pytest.raises(SystemExit):
        run.main(flags)
    assert "--peft lora" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# One real 2-rank run per profile


def eval_loss_of_saved_adapters(base: Path, output_dir: Path, flags: list[str]) -> float:
    """The run's eval loss recomputed from the base on disk and the adapters it saved: equal to the
    run's own only if training changed nothing but the adapters."""
    from peft import PeftModel

    from finetune.data import build_datasets

    _, data_args, training_args = parse_arguments(flags)
    tokenizer = AutoTokenizer.from_pretrained(base)
    data = build_datasets(data_args, tokenizer, data_args.block_size, training_args.seed)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), output_dir).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for sample in data.evaluation:
            labels = torch.tensor([sample["labels"]])
            predicted = int((labels[:, 1:] != -100).sum())
            total += model(torch.tensor([sample["input_ids"]]), labels=labels).loss.item() * predicted
            count += predicted
    return total / count


# Every multi-process profile but zero3 (on instruction data below): the single profile is `lora_run`
# above, one process.
LAUNCHED_PROFILES = [
    *("ddp", "fsdp", "fsdp_grad_op", "zero1", "zero2"),
    *("zero2_offload", "zero3_offload", "zero3_nvme"),
]


@pytest.mark.integration
@pytest.mark.parametrize("profile", LAUNCHED_PROFILES)
def test_lora_trains_only_the_adapters_on_two_ranks(profile, base_dir, corpus, tmp_path):
    output_dir = tmp_path / "out"
    flags = run_flags(base_dir, corpus, output_dir, "--save_strategy", "no")
    launched = [*flags[: flags.index("--output_dir")], *nvme_flags(profile, output_dir)]
    launch(accelerate_launch(profile), output_dir, launched)
    summary = read_summary(output_dir)
    losses = [point["loss"] for point in summary["loss_curve"]]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert summary["zero3_leaf_modules"] == (["GPT2Block"] if profile.startswith("zero3") else None)
    model = add_adapters(AutoModelForCausalLM.from_pretrained(base_dir), lora_flags(), "fp32")
    assert summary["trainable_parameters"] == trainable_parameters(model)
    saved = load_file(output_dir / "adapter_model.safetensors")
    assert all("lora_" in name for name in saved)
    assert any("lora_B" in name and tensor.abs().sum() > 0 for name, tensor in saved.items())
    recomputed = eval_loss_of_saved_adapters(base_dir, output_dir, flags)
    assert recomputed == pytest.approx(summary["eval_loss"], rel=1e-4)


@pytest.mark.integration
def test_lora_on_gsm8k_trains_the_answers_packed_on_two_zero3_ranks(base_dir, data_dir, tmp_path):
    """The job the issue names: instruction data, answer-only loss, packed blocks, adapters on a base
    that ZeRO-3 shards over 2 ranks."""
    output_dir = tmp_path / "out"
    # the last --block_size counts; nearly all of GSM8K's examples are under 1024 bytes
    no_saves_longer_blocks = ("--save_strategy", "no", "--block_size", "1024")
    flags = run_flags(base_dir, data_dir / "gsm8k", output_dir, *no_saves_longer_blocks)
    launch(accelerate_launch("zero3"), output_dir, flags[: flags.index("--output_dir")])
    summary = read_summary(output_dir)
    assert (summary["status"], summary["world_size"], summary["zero_stage"]) == ("completed", 2, 3)
    assert summary["data_format"] == "question_answer"
    assert summary["masked_tokens"] > 0 and summary["train_tokens"] > 0
    assert 0.9 < summary["packing_efficiency"] <= 1
    losses = [point["loss"] for point in summary["loss_curve"]]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert summary["trainable_parameters"] < summary["parameters"] / 10


@pytest.mark.integration
def test_lora_under_zero3_gathers_by_block_and_trains_as_hooks_per_module_do(base_dir, corpus, tmp_path):
    """Each block one DeepSpeed leaf with adapters on a frozen base: torch fires a block's full
    backward hook early when its input needs no gradient (the first block, after frozen embeddings),
    and DeepSpeed then reduced that block's adapters before their gradients existed."""
    per_block, per_module = tmp_path / "per_block", tmp_path / "per_module"
    flags = run_flags(base_dir, corpus, per_block, "--save_strategy", "no", "--precision", "fp32")
    launch(accelerate_launch("zero3"), per_block, flags[: flags.index("--output_dir")])
    config = json.loads((PROJECT_ROOT / "ds_configs" / "zero3.json").read_text())
    config["zero_optimization"]["leaf_module"] = {"classes": []}
    (tmp_path / "per_module.json").write_text(json.dumps(config))
    command = accelerate_launch("zero3")
    script = command.index("finetune/run.py")
    command[script:script] = ["--deepspeed_config_file", str(tmp_path / "per_module.json")]
    launch(command, per_module, flags[: flags.index("--output_dir")])
    by_block, by_module = read_summary(per_block), read_summary(per_module)
    assert (by_block["zero3_leaf_modules"], by_module["zero3_leaf_modules"]) == (["GPT2Block"], None)
    assert [p["loss"] for p in by_block["loss_curve"]] == pytest.approx(
        [p["loss"] for p in by_module["loss_curve"]], rel=1e-5
    )
    assert by_block["eval_loss"] == pytest.approx(by_module["eval_loss"], rel=1e-5)
    assert by_block["eval_loss"] < by_block["loss_curve"][0]["loss"]


@pytest.fixture
def run_from_a_relative_path(base_dir, corpus, tmp_path, monkeypatch, in_process_commands):
    """A LoRA run whose --model is relative to the directory it was launched from."""
    project = tmp_path / "project"
    shutil.copytree(base_dir, project / "base")
    monkeypatch.chdir(project)
    output_dir = project / "runs" / "chat"
    run.main(run_flags(Path("base"), corpus, Path("runs/chat"), "--save_steps", "2"))
    monkeypatch.chdir(tmp_path)
    return project, output_dir


def test_a_relative_base_model_is_recorded_as_an_absolute_path(run_from_a_relative_path):
    project, output_dir = run_from_a_relative_path
    base = str(project / "base")
    assert read_manifest(output_dir / "checkpoint-4")["run"]["flags"]["model"] == base
    assert json.loads((output_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == base


def test_export_from_another_directory_finds_the_base(run_from_a_relative_path, tmp_path):
    _, output_dir = run_from_a_relative_path
    export_checkpoint(output_dir / "checkpoint-4", tmp_path / "merged", merge=True)
    assert (tmp_path / "merged" / "model.safetensors").is_file()


def test_export_takes_a_base_model_that_moved(run_from_a_relative_path, tmp_path):
    project, output_dir = run_from_a_relative_path
    shutil.move(project / "base", tmp_path / "moved-base")
    with pytest.raises(FinetuneError, match=r"cannot load its base model|not found"):
        export_checkpoint(output_dir / "checkpoint-4", tmp_path / "a", merge=True)
    export_checkpoint(
        output_dir / "checkpoint-4", tmp_path / "b", merge=True, base_model=str(tmp_path / "moved-base")
    )
    assert (tmp_path / "b" / "model.safetensors").is_file()


@pytest.mark.integration
def test_compare_with_variants_trains_each_profile_in_full_and_with_lora(base_dir, corpus, tmp_path):
    output_dir = tmp_path / "compare"
    flags = ["--model", str(base_dir), "--dataset", str(corpus), "--block_size", "64", "--max_steps", "3",
             "--batch_size", "4", "--max_eval_samples", "8", "--report_to", "none",
             "--disable_tqdm", "true"]  # fmt: skip
    command = [sys.executable, "-m", "finetune", "compare", "--profiles", "ddp", "--num_processes", "2",
               "--variants", "full,lora", "--output_dir", str(output_dir), *flags]  # fmt: skip
    result = subprocess.run(
        command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = {row.training: row for row in read_rows(output_dir)}
    assert sorted(rows) == ["full", "lora"]
    assert {row.status for row in rows.values()} == {"completed"}
    summaries = {name: read_summary(output_dir / row.run_dir) for name, row in rows.items()}
    assert summaries["lora"]["trainable_parameters"] < summaries["full"]["trainable_parameters"]
