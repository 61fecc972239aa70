"""Flags and YAML recipes parse into ModelArguments, DataArguments and FinetuneTrainingArguments."""

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.state import AcceleratorState, PartialState

from finetune.arguments import (
    FSDP_BLOCKS_PER_UNIT,
    DataArguments,
    FinetuneTrainingArguments,
    ModelArguments,
    make_parser,
    parse_arguments,
)
from finetune.deepspeed_json import check_values_match_the_flags
from finetune.errors import FinetuneError
from finetune.launch_settings import compiles_by_default, resolve_launch_settings
from finetune.launched import Launch, mixed_precision
from finetune.profiles import load_strategy
from finetune.run_flags import FLAG_NAMES, LOWEST_VALUES

from launching import resolve_and_set_up

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NVME_CONFIG = PROJECT_ROOT / "ds_configs" / "zero3_nvme.json"

RECIPE = """\
model: gpt2-medium
from_scratch: true
dataset: wikitext-2-v1
packing: false
block_size: 128
batch_size: 4
epochs: 2
learning_rate: 0.0003
"""
RECIPE_AS_FLAGS = [
    "--model", "gpt2-medium",
    "--from_scratch",
    "--dataset", "wikitext-2-v1",
    "--no_packing",
    "--block_size", "128",
    "--batch_size", "4",
    "--epochs", "2",
    "--learning_rate", "3e-4",
]  # fmt: skip


def write_recipe(tmp_path, output_flags, text=RECIPE):
    output_dir, report_to = output_flags[1], output_flags[3]
    path = tmp_path / "recipe.yaml"
    path.write_text(text + f"output_dir: {output_dir}\nreport_to: {report_to}\n")
    return path


def test_flags_parse_into_the_three_dataclasses(output_flags):
    model, data, training = parse_arguments(["--model_name_or_path", "distilgpt2", *output_flags])
    assert isinstance(model, ModelArguments)
    assert isinstance(data, DataArguments)
    assert isinstance(training, FinetuneTrainingArguments)
    assert model.model == "distilgpt2"


def test_aliases_set_their_fields(output_flags):
    argv = ["--model", "gpt2-large", "--batch_size", "3", "--epochs", "2.5", "--num_samples", "7"]
    argv += ["--dataset", "tiny-shakespeare", *output_flags]
    model, data, training = parse_arguments(argv)
    assert model.model == "gpt2-large"
    assert training.per_device_train_batch_size == 3
    assert training.num_train_epochs == 2.5
    assert data.max_train_samples == 7
    assert data.dataset == "tiny-shakespeare"


def test_recipe_parses_the_same_as_its_flags(tmp_path, output_flags):
    from_recipe = parse_arguments([str(write_recipe(tmp_path, output_flags))])
    from_flags = parse_arguments([*RECIPE_AS_FLAGS, *output_flags])
    assert from_recipe[0] == from_flags[0]
    assert from_recipe[1] == from_flags[1]
    assert from_recipe[2].to_dict() == from_flags[2].to_dict()
    assert from_recipe[0].from_scratch is True
    assert from_recipe[1].packing is False


def test_flag_after_recipe_overrides_it(tmp_path, output_flags):
    recipe = write_recipe(tmp_path, output_flags)
    model, _, training = parse_arguments([str(recipe), "--batch_size", "2", "--model", "gpt2"])
    assert training.per_device_train_batch_size == 2
    assert model.model == "gpt2"
    assert training.num_train_epochs == 2  # not overridden: still the recipe's


def test_unknown_recipe_key_is_named_in_the_error(tmp_path, output_flags):
    recipe = write_recipe(tmp_path, output_flags, RECIPE + "batchsize: 4\n")
    with pytest.raises(FinetuneError, match="unknown key") as error:
        parse_arguments([str(recipe)])
    assert "batchsize" in str(error.value)
    assert str(recipe) in str(error.value)


def test_batch_size_zero_is_rejected(output_flags):
    with pytest.raises(FinetuneError, match="batch_size"):
        parse_arguments(["--batch_size", "0", *output_flags])


def test_precision_fp32_turns_off_mixed_precision(output_flags):
    _, _, training = parse_arguments(["--precision", "fp32", *output_flags])
    assert training.bf16 is False
    assert training.fp16 is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="a lone process trains on its GPU there")
def test_bf16_asked_of_a_lone_process_without_a_gpu_trains_in_bf16_on_the_cpu(output_flags):
    """transformers refused it ("Your setup doesn't support bf16/gpu") unless --use_cpu was given."""
    _, _, training_args = parse_arguments(["--precision", "bf16", *output_flags])
    resolve_and_set_up(training_args, Launch.from_environment())
    assert training_args.bf16 and training_args.use_cpu


@pytest.mark.parametrize(("profile", "precision"), [("zero2", "bf16"), ("zero3", "fp16"), ("fsdp", "bf16")])
def test_mixed_precision_a_profiles_cpu_ranks_cannot_take_is_refused_in_one_line(
    output_flags, profile, precision
):
    """It was transformers' "Your setup doesn't support bf16/gpu" (asking for use_cpu, which turns
    DeepSpeed and FSDP off) or a DeepSpeed traceback on every rank ("Type fp16 is not supported")."""
    _, _, training_args = parse_arguments(["--precision", precision, *output_flags])
    with pytest.raises(
        FinetuneError, match=f"--precision {precision}: profile {profile} .* on GPUs only"
    ) as error:
        resolve_launch_settings(training_args, Launch(load_strategy(profile), on_gpu=False))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("profile", "precision", "on_gpu"),
    [("ddp", "bf16", False), ("fsdp", "fp16", False), ("zero2", "bf16", True), ("zero3", "fp16", True)],
)
def test_mixed_precision_the_ranks_can_take_is_kept(output_flags, profile, precision, on_gpu):
    _, _, training_args = parse_arguments(["--precision", precision, *output_flags])
    resolve_launch_settings(training_args, Launch(load_strategy(profile), on_gpu=on_gpu))
    assert mixed_precision(training_args) == precision


@pytest.mark.parametrize(
    ("setting", "mismatch"),
    [({"gradient_clipping": 0.5}, "ds gradient_clipping=0.5 vs hf max_grad_norm=1.0"),
     ({"train_batch_size": 64}, "ds train_batch_size=64 vs hf train_batch_size (calculated)=8")],
)  # fmt: skip
def test_a_deepspeed_value_the_flags_set_otherwise_is_refused_once_the_devices_are_set_up(
    output_flags, setting, mismatch
):
    """transformers refused it after the data and model were built, a traceback on every rank."""
    from transformers.integrations import deepspeed as hf_deepspeed

    _, _, training_args = parse_arguments(output_flags)
    resolve_and_set_up(training_args, Launch.from_environment())
    config = {"zero_optimization": {"stage": 3}, "gradient_clipping": "auto", **setting}
    held = hf_deepspeed._hf_deepspeed_config_weak_ref
    with pytest.raises(
        FinetuneError,
        match=f'zero3.json: set otherwise by the training flags: {re.escape(mismatch)}: make them "auto"',
    ):
        check_values_match_the_flags(Path("zero3.json"), config, training_args)
    assert hf_deepspeed._hf_deepspeed_config_weak_ref is held  # ZeRO-3 model init reads it
    check_values_match_the_flags(
        Path("zero3.json"), {"zero_optimization": {"stage": 3}, "gradient_clipping": 1.0}, training_args
    )


def test_block_size_of_one_token_is_rejected(output_flags):
    with pytest.raises(FinetuneError, match="block_size"):
        parse_arguments(["--block_size", "1", *output_flags])


def test_nan_losses_show_in_the_logged_loss_by_default(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    assert training_args.logging_nan_inf_filter is False


def test_chunked_loss_is_opt_in(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    assert training_args.chunked_loss is False
    _, _, training_args = parse_arguments([*output_flags, "--chunked_loss"])
    assert training_args.chunked_loss is True


def test_no_compilation_by_default_on_a_machine_without_gpu(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    resolve_and_set_up(training_args, Launch.from_environment())
    assert training_args.torch_compile is False


@pytest.mark.parametrize(
    ("flags", "mode"),
    [(["--gradient_checkpointing", "true"], "default"), ([], None),
     (["--gradient_accumulation_steps", "2"], "default"),
     (["--attn_implementation", "flex_attention"], "default"),
     (["--attn_implementation", "flex_attention", "--torch_compile_mode", "reduce-overhead"],
      "reduce-overhead")],
)  # fmt: skip
def test_a_profiles_cuda_graphs_are_not_used_with_checkpointing_accumulation_or_flex_attention(
    output_flags, monkeypatch, flags, mode
):
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")  # as the single profile launches
    _, _, training_args = parse_arguments([*output_flags, "--torch_compile", "true", *flags])
    resolve_and_set_up(training_args, Launch.from_environment())
    assert training_args.torch_compile_mode == mode


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graphs_asked_for_with_gradient_checkpointing_are_refused_in_one_line(output_flags, mode):
    with pytest.raises(FinetuneError, match=f"--torch_compile_mode {mode} records CUDA graphs") as error:
        parse_arguments([*output_flags, "--gradient_checkpointing", "true", "--torch_compile_mode", mode])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graphs_asked_for_over_accumulated_micro_batches_are_refused_in_one_line(output_flags, mode):
    """A replay overwrote what the backward of the micro batch before still read (a ddp run resumed on
    half its GPUs, its accumulation doubled, failed at the first backward on two H200)."""
    flags = ["--gradient_accumulation_steps", "2", "--torch_compile_mode", mode]
    _, _, training_args = parse_arguments([*output_flags, *flags])
    expected = f"--torch_compile_mode {mode} records CUDA graphs, which 2 accumulated micro batches break"
    with pytest.raises(FinetuneError, match=expected) as error:
        resolve_and_set_up(training_args, Launch.from_environment())
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("profile", ["fsdp", "fsdp_grad_op", "zero3", "zero3_offload"])
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graphs_asked_for_under_fsdp_or_zero3_are_refused_in_one_line(output_flags, profile, mode):
    _, _, training_args = parse_arguments([*output_flags, "--torch_compile_mode", mode])
    with pytest.raises(
        FinetuneError, match=f"--torch_compile_mode {mode} records CUDA graphs, which profile {profile}"
    ) as error:
        resolve_launch_settings(training_args, Launch(load_strategy(profile)))
    assert "\n" not in str(error.value)


def test_a_profiles_own_cuda_graphs_under_fsdp_are_refused_when_compiled(output_flags, monkeypatch):
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")  # a user's FSDP profile asking for them
    _, _, training_args = parse_arguments([*output_flags, "--torch_compile", "true"])
    with pytest.raises(FinetuneError, match="the profile's dynamo_mode reduce-overhead records CUDA graphs"):
        resolve_launch_settings(training_args, Launch(load_strategy("fsdp")))


@pytest.mark.parametrize("profile", ["ddp", "zero1", "zero2"])
def test_cuda_graphs_asked_for_under_ddp_or_zero1_2_are_kept(output_flags, profile):
    _, _, training_args = parse_arguments([*output_flags, "--torch_compile_mode", "reduce-overhead"])
    resolve_launch_settings(training_args, Launch(load_strategy(profile)))
    assert training_args.torch_compile_mode == "reduce-overhead"


def test_compilation_is_on_by_default_with_cuda_unless_told_to_use_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert compiles_by_default(False, Launch.from_environment()) is True
    assert compiles_by_default(True, Launch.from_environment()) is False


def test_fsdp_is_compiled_by_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert compiles_by_default(False, Launch.from_environment()) is True


def test_fsdp_with_parameter_offload_is_not_compiled_by_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    assert compiles_by_default(False, Launch.from_environment()) is False


@pytest.mark.parametrize(
    ("deepspeed_config", "compiled"),
    [("zero1", True), ("zero2", True), ("zero3", True), ("zero2_offload", False), ("zero3_offload", False)],
)
def test_deepspeed_without_offload_is_compiled_by_default(monkeypatch, deepspeed_config, compiled):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    config_file = PROJECT_ROOT / "ds_configs" / f"{deepspeed_config}.json"
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(config_file))
    assert compiles_by_default(False, Launch.from_environment()) is compiled


def test_ddp_gradient_buckets_default_to_200_mb_and_can_be_set(output_flags):
    _, _, default = parse_arguments(output_flags)
    _, _, chosen = parse_arguments([*output_flags, "--ddp_bucket_cap_mb", "50"])
    assert (default.ddp_bucket_cap_mb, chosen.ddp_bucket_cap_mb) == (200, 50)


def declared_default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def test_every_flag_finetune_declares_parses_to_the_default_its_field_declares(output_flags):
    """HfArgumentParser reads no default_factory of a bool field (it gives False): a default written that
    way is lost before any code sees it, as the page-locked batches' was on every GPU run."""
    parsed = vars(make_parser().parse_args(output_flags))
    own = [field for cls in (ModelArguments, DataArguments) for field in dataclasses.fields(cls)]
    own += [field for field in dataclasses.fields(FinetuneTrainingArguments)
            if field.name in vars(FinetuneTrainingArguments)["__annotations__"]]  # fmt: skip
    given = {"output_dir", "report_to"}
    assert {field.name: parsed[field.name] for field in own if field.init and field.name not in given} == {
        field.name: declared_default(field) for field in own if field.init and field.name not in given
    }


def test_batches_on_gpus_are_page_locked_and_copied_without_waiting_for_the_gpu(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    resolve_launch_settings(training_args, Launch(load_strategy("ddp"), on_gpu=True))
    assert training_args.dataloader_pin_memory is True
    assert training_args.accelerator_config == {"non_blocking": True}


def test_batches_on_cpus_are_neither_page_locked_nor_copied(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    resolve_launch_settings(training_args, Launch(load_strategy("ddp"), on_gpu=False))
    assert training_args.dataloader_pin_memory is False
    assert training_args.accelerator_config is None


def test_an_accelerator_config_given_is_kept_as_given(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--accelerator_config", '{"even_batches": false}'])
    resolve_launch_settings(training_args, Launch(load_strategy("ddp"), on_gpu=True))
    assert training_args.accelerator_config == '{"even_batches": false}'


def test_unpinned_batches_asked_for_on_gpus_are_copied_as_transformers_copies_them(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--dataloader_pin_memory", "false"])
    resolve_launch_settings(training_args, Launch(load_strategy("ddp"), on_gpu=True))
    assert (training_args.dataloader_pin_memory, training_args.accelerator_config) == (False, None)


def test_compilation_can_be_asked_for_on_cpu(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--torch_compile", "true"])
    resolve_and_set_up(training_args, Launch.from_environment())
    assert training_args.torch_compile is True


def test_a_bare_torch_compile_flag_asks_for_compilation(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--torch_compile"])
    assert training_args.torch_compile is True


def test_the_output_matmul_is_aligned_unless_told_not_to(output_flags):
    _, _, default = parse_arguments(output_flags)
    _, _, kept = parse_arguments([*output_flags, "--no_align_output_matmul"])
    assert (default.align_output_matmul, kept.align_output_matmul) == (True, False)


def use_nvme_profile(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(NVME_CONFIG))


def test_parsing_reads_no_launcher_variable(output_flags, monkeypatch):
    use_nvme_profile(monkeypatch)  # asks for --nvme_path, once the launch is applied
    _, _, training_args = parse_arguments(output_flags)
    assert training_args.torch_compile is None
    with pytest.raises(FinetuneError, match="--nvme_path"):
        resolve_and_set_up(training_args, Launch.from_environment())


def test_parsing_creates_no_folder(output_flags, monkeypatch, tmp_path):
    use_nvme_profile(monkeypatch)
    nvme = tmp_path / "nvme"
    _, _, training_args = parse_arguments([*output_flags, "--nvme_path", str(nvme)])
    assert not nvme.exists()
    resolve_and_set_up(training_args, Launch.from_environment())
    assert nvme.is_dir()


def test_the_nvme_profiles_json_reaches_accelerate_filled_in_as_the_launchers_file(
    output_flags, monkeypatch, tmp_path
):
    """Not as TrainingArguments.deepspeed, whose "auto" batch sizes transformers fills from a world
    size it may not know yet: on 2 CPU ranks DeepSpeed then refused the batch as 4 != 4 * 1 * 2."""
    use_nvme_profile(monkeypatch)
    nvme = tmp_path / "nvme"
    _, _, training_args = parse_arguments([*output_flags, "--nvme_path", str(nvme)])
    resolve_and_set_up(training_args, Launch.from_environment())
    handed = Path(os.environ["ACCELERATE_DEEPSPEED_CONFIG_FILE"])
    assert handed.parent == nvme.resolve()
    config = json.loads(handed.read_text())
    zero = config["zero_optimization"]
    swapped = [zero[key]["nvme_path"] for key in ("offload_param", "offload_optimizer")]
    assert swapped == [str(nvme.resolve())] * 2
    assert config["train_batch_size"] == "auto"
    assert training_args.deepspeed is None


def test_parsing_sets_up_no_device(output_flags):
    AcceleratorState._reset_state(reset_partial_state=True)
    _, _, training_args = parse_arguments(output_flags)
    assert PartialState._shared_state == {}
    resolve_and_set_up(training_args, Launch.from_environment())
    assert training_args.device.type == "cpu"


def test_a_value_transformers_refuses_is_one_error_when_the_launch_is_applied(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--logging_steps", "2.5"])
    with pytest.raises(FinetuneError, match="--logging_steps must be an integer"):
        resolve_and_set_up(training_args, Launch.from_environment())


def test_blocks_per_fsdp_unit_is_refused_outside_the_fsdp_profiles(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--fsdp_blocks_per_unit", "2"])
    with pytest.raises(FinetuneError, match="--fsdp_blocks_per_unit is for the FSDP profiles"):
        resolve_and_set_up(training_args, Launch.from_environment())


def test_blocks_per_fsdp_unit_must_be_at_least_one(output_flags):
    with pytest.raises(FinetuneError, match="--fsdp_blocks_per_unit must be at least 1, got 0"):
        parse_arguments([*output_flags, "--fsdp_blocks_per_unit", "0"])


def test_fsdp_prefetch_is_refused_outside_the_fsdp_profiles(output_flags):
    _, _, training_args = parse_arguments([*output_flags, "--fsdp_prefetch", "1"])
    with pytest.raises(FinetuneError, match="--fsdp_prefetch is for the FSDP profiles; profile single"):
        resolve_and_set_up(training_args, Launch.from_environment())


def test_fsdp_prefetch_cannot_be_negative(output_flags):
    with pytest.raises(
        FinetuneError, match=r"--fsdp_prefetch must be 0 or more \(0: FSDP2.s implicit prefetch\), got -1"
    ):
        parse_arguments([*output_flags, "--fsdp_prefetch", "-1"])


def test_blocks_per_fsdp_unit_defaults_to_one_outside_the_fsdp_profiles(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    resolve_and_set_up(training_args, Launch.from_environment())
    assert training_args.fsdp_blocks_per_unit == 1


def test_blocks_per_fsdp_unit_defaults_to_four_under_the_fsdp_profiles(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    resolve_and_set_up(training_args, Launch(load_strategy("fsdp")))
    assert training_args.fsdp_blocks_per_unit == FSDP_BLOCKS_PER_UNIT == 4


@pytest.mark.parametrize(("flags", "asked"), [([], False), (["--gradient_checkpointing"], True)])
def test_checkpointing_is_a_bool_before_the_launch_sets_up_training_arguments(flags, asked, output_flags):
    _, _, training_args = parse_arguments(["--model", "gpt2", *flags, *output_flags])
    assert training_args.gradient_checkpointing is asked


NEWER_CHECKPOINTING_NAME = any(
    f.name == "activation_checkpointing" for f in dataclasses.fields(FinetuneTrainingArguments)
)


@pytest.mark.skipif(
    not NEWER_CHECKPOINTING_NAME, reason="this transformers has no --activation_checkpointing"
)
def test_the_newer_activation_checkpointing_flag_asks_for_gradient_checkpointing(output_flags):
    _, _, training_args = parse_arguments(["--model", "gpt2", "--activation_checkpointing", *output_flags])
    assert training_args.gradient_checkpointing is True


@pytest.mark.parametrize("name", list(LOWEST_VALUES))
def test_every_numeric_flag_below_its_lowest_value_is_one_error_naming_the_flag(name):
    lowest, _ = LOWEST_VALUES[name]
    flag = FLAG_NAMES.get(name, f"--{name}")
    with pytest.raises(FinetuneError, match=rf"^{flag} must be .*, got {lowest - 1}"):
        parse_arguments(["--model", "gpt2", f"{flag}={lowest - 1}"])
