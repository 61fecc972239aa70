"""Strategy profiles: the shipped ones load and are described; broken ones fail naming file and key."""

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from finetune.cli import main
from finetune.deepspeed_json import check_final_model_gathered, fill_nvme_path, needs_nvme_path
from finetune.errors import FinetuneError
from finetune.launch import Placement, launch_command, resolved_profile_file
from finetune.launched import CompilePlan, Launch
from finetune.profiles import (
    PROFILES_TABLE_MARKERS,
    Strategy,
    available_profiles,
    load_profile,
    load_strategy,
    profiles_table,
    shipped_folder,
    shipped_strategies,
)

README = Path(__file__).resolve().parents[1] / "README.md"
SHIPPED = available_profiles()
SHIPPED_DEEPSPEED = [path for path in SHIPPED if "DEEPSPEED" in path.read_text()]


def write_profile(tmp_path, text, name="broken.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def write_deepspeed_profile(tmp_path, zero_optimization):
    """A DEEPSPEED profile naming a JSON (absolute path) with the given zero_optimization section."""
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": zero_optimization,
    }
    json_path = tmp_path / "ds.json"
    json_path.write_text(json.dumps(config))
    profile_text = f"distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: {json_path}\n"
    return write_profile(tmp_path, profile_text), json_path


def nvme_config():
    return {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": "auto"},
            "offload_param": {"device": "nvme", "nvme_path": "auto"},
        }
    }


def test_profiles_are_shipped():
    assert {"single", "ddp", "fsdp", "zero2", "zero3"} <= {path.stem for path in SHIPPED}
    assert SHIPPED_DEEPSPEED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_shipped_profile_loads_with_a_description(path):
    profile = load_profile(path)
    assert profile.name == path.stem
    assert profile.description


@pytest.mark.parametrize("path", SHIPPED_DEEPSPEED, ids=lambda path: path.stem)
def test_deepspeed_profile_leaves_batch_and_clipping_to_the_flags(path):
    profile = load_profile(path)
    assert profile.deepspeed_config_path.is_file()
    config = json.loads(profile.deepspeed_config_path.read_text())
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
        assert config[key] == "auto", key


def test_profiles_command_lists_every_profile(capsys):
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    for path in SHIPPED:
        assert path.stem in out


def test_invalid_yaml_names_the_file(tmp_path):
    path = write_profile(tmp_path, "distributed_type: [DEEPSPEED\n")
    with pytest.raises(FinetuneError, match="not valid YAML") as error:
        load_profile(path)
    assert str(path) in str(error.value)


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    """YAML keeps the last of two equal keys silently: a copied profile edited by adding a key it
    already had would launch with whichever came last."""
    path = write_profile(
        tmp_path, "distributed_type: MULTI_GPU\nmixed_precision: bf16\ndistributed_type: FSDP\n"
    )
    with pytest.raises(FinetuneError) as error:
        load_profile(path)
    assert str(error.value) == (
        f"{path} line 3: not valid YAML ('distributed_type' is given twice (first on line 1))"
    )


def test_a_deepspeed_json_key_given_twice_is_refused(tmp_path):
    """accelerate hands DeepSpeed the parsed config, so DeepSpeed's own refusal of a repeated key
    (which its file reader has) never runs."""
    path, json_path = write_deepspeed_profile(tmp_path, {"stage": 3})
    json_path.write_text(json_path.read_text().replace('"stage": 3', '"stage": 3, "stage": 2'))
    with pytest.raises(FinetuneError) as error:
        load_profile(path)
    assert str(error.value) == f"{json_path.resolve()}: not valid JSON ('stage' is given twice in one object)"


def test_unknown_distributed_type_names_file_and_key(tmp_path):
    path = write_profile(tmp_path, "distributed_type: MEGATRON\n")
    with pytest.raises(FinetuneError, match="distributed_type") as error:
        load_profile(path)
    assert str(path) in str(error.value)
    assert "MEGATRON" in str(error.value)


def test_missing_deepspeed_config_file_names_file_and_key(tmp_path):
    path = write_profile(
        tmp_path, "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero3_init_flag: true\n"
    )
    with pytest.raises(FinetuneError, match="deepspeed_config_file") as error:
        load_profile(path)
    assert str(path) in str(error.value)


def test_nvme_offload_without_a_path_asks_for_nvme_path(tmp_path):
    path, json_path = write_deepspeed_profile(tmp_path, {"stage": 3, "offload_optimizer": {"device": "nvme"}})
    with pytest.raises(FinetuneError, match=r"offload_optimizer\.nvme_path") as error:
        load_profile(path)
    assert str(json_path.resolve()) in str(error.value)


def test_parameter_offload_with_stage_2_is_rejected(tmp_path):
    path, json_path = write_deepspeed_profile(tmp_path, {"stage": 2, "offload_param": {"device": "cpu"}})
    with pytest.raises(FinetuneError, match="offload_param") as error:
        load_profile(path)
    assert str(json_path.resolve()) in str(error.value)


def test_profiles_command_fails_on_a_broken_file_with_one_error_line(tmp_path, capsys):
    path = write_profile(tmp_path, "distributed_type: MEGATRON\n")
    assert main(["profiles", str(path)]) == 1
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1
    assert err_lines[0].startswith("finetune: error:")
    assert str(path) in err_lines[0]


@pytest.mark.parametrize(
    "zero", [{"stage": 3}, {"stage": 3, "stage3_gather_16bit_weights_on_model_save": False}]
)
def test_a_run_under_zero3_needs_its_weights_gathered_on_save(zero):
    """DeepSpeed's default is false, and the run's model folder is written by gathering them."""
    with pytest.raises(FinetuneError, match="stage3_gather_16bit_weights_on_model_save: must be true"):
        check_final_model_gathered(Path("ds.json"), {"zero_optimization": zero})


def test_only_zero3_gathers_its_weights_on_save():
    check_final_model_gathered(Path("ds.json"), {"zero_optimization": {"stage": 2}})
    for name in ("zero3", "zero3_offload", "zero3_nvme"):
        config = json.loads((shipped_folder("ds_configs") / f"{name}.json").read_text())
        check_final_model_gathered(Path(f"{name}.json"), config)


def test_needs_nvme_path_only_with_the_placeholder():
    assert needs_nvme_path(nvme_config())
    filled = nvme_config()
    for section in ("offload_optimizer", "offload_param"):
        filled["zero_optimization"][section]["nvme_path"] = "/scratch/nvme"
    assert not needs_nvme_path(filled)
    assert not needs_nvme_path({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})


def test_fill_nvme_path_fills_both_sections_with_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    filled = fill_nvme_path(nvme_config(), "nvme")
    for section in ("offload_optimizer", "offload_param"):
        value = filled["zero_optimization"][section]["nvme_path"]
        assert Path(value).is_absolute()
        assert Path(value) == (tmp_path / "nvme").resolve()
    assert not needs_nvme_path(filled)


def test_fill_nvme_path_does_not_mutate_its_input():
    config = nvme_config()
    before = copy.deepcopy(config)
    fill_nvme_path(config, "/scratch/nvme")
    assert config == before


def test_resolved_profile_file_has_an_absolute_existing_deepspeed_json(tmp_path):
    profile = load_profile("zero2")
    written = yaml.safe_load(resolved_profile_file(profile, tmp_path).read_text())
    ds_file = Path(written["deepspeed_config"]["deepspeed_config_file"])
    assert ds_file.is_absolute()
    assert ds_file.is_file()
    assert written["distributed_type"] == "DEEPSPEED"
    assert profile.settings["deepspeed_config"]["deepspeed_config_file"] == "ds_configs/zero2.json"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_resolved_profile_file_loads_as_the_same_profile(path, tmp_path):
    profile = load_profile(path)
    reloaded = load_profile(resolved_profile_file(profile, tmp_path))
    assert reloaded.distributed_type == profile.distributed_type
    assert reloaded.deepspeed_config == profile.deepspeed_config


def port_flag(command: list[str]) -> str | None:
    return command[command.index("--main_process_port") + 1] if "--main_process_port" in command else None


def test_runs_on_one_machine_take_a_free_port_so_two_at_once_do_not_collide(tmp_path):
    command = launch_command(load_profile("ddp"), tmp_path / "ddp.yaml", Placement(num_processes=2), [])
    assert port_flag(command) == "0"


def test_a_port_given_by_flag_or_profile_or_a_second_machine_is_kept(tmp_path):
    ddp = load_profile("ddp")
    given = launch_command(ddp, tmp_path / "a.yaml", Placement(num_processes=2, main_process_port=29600), [])
    two_machines = launch_command(ddp, tmp_path / "b.yaml", Placement(num_processes=4, num_machines=2), [])
    pinned = copy.deepcopy(ddp)
    pinned.settings["main_process_port"] = 29700
    in_profile = launch_command(pinned, tmp_path / "c.yaml", Placement(num_processes=2), [])
    assert (port_flag(given), port_flag(two_machines), port_flag(in_profile)) == ("29600", None, None)


def test_shipped_profiles_are_ordered_fastest_first_by_what_they_shard_and_offload():
    assert [strategy.name for strategy in shipped_strategies()] == [
        "single",
        "ddp",
        "zero1",
        "zero2",
        "fsdp_grad_op",
        "fsdp",
        "zero3",
        "zero2_offload",
        "zero3_offload",
        "zero3_nvme",
    ]


@pytest.mark.parametrize(
    ("name", "framework", "sharded", "offloaded"),
    [
        ("single", "single", set(), {}),
        ("ddp", "ddp", set(), {}),
        ("zero1", "deepspeed", {"optimizer"}, {}),
        ("fsdp_grad_op", "fsdp", {"optimizer", "gradients"}, {}),
        ("fsdp", "fsdp", {"optimizer", "gradients", "parameters"}, {}),
        ("zero2_offload", "deepspeed", {"optimizer", "gradients"}, {"optimizer": "cpu"}),
        (
            "zero3_nvme",
            "deepspeed",
            {"optimizer", "gradients", "parameters"},
            {"optimizer": "nvme", "parameters": "nvme"},
        ),
    ],
)
def test_a_strategy_says_what_its_files_shard_and_offload(name, framework, sharded, offloaded):
    strategy = load_strategy(name)
    assert (strategy.framework, set(strategy.sharded), strategy.offloaded) == (framework, sharded, offloaded)


@pytest.mark.parametrize("name", ["fsdp_grad_op", "fsdp"])
def test_fsdp2_keeps_its_parameters_sharded_between_uses_under_either_profile(name):
    assert load_strategy(name).kept_sharded == {"optimizer", "gradients", "parameters"}


@pytest.mark.parametrize("name", ["ddp", "zero1", "zero2", "zero3"])
def test_other_profiles_keep_sharded_what_their_stage_shards(name):
    strategy = load_strategy(name)
    assert strategy.kept_sharded == strategy.sharded


def test_only_nvme_offload_to_the_placeholder_folder_needs_nvme_path():
    assert [s.name for s in shipped_strategies() if s.needs_nvme_path] == ["zero3_nvme"]


def test_zero3_is_deepspeeds_stage_3_whatever_the_profile_is_called(tmp_path):
    zero3 = sorted(strategy.name for strategy in shipped_strategies() if strategy.is_zero3)
    assert zero3 == ["zero3", "zero3_nvme", "zero3_offload"]
    stage_3, _ = write_deepspeed_profile(tmp_path, {"stage": 3})
    assert load_strategy(stage_3).is_zero3


def test_offload_runs_eager_by_default_and_the_rest_compiled():
    eager = [s.name for s in shipped_strategies() if not s.compiled_by_default]
    assert eager == ["zero2_offload", "zero3_offload", "zero3_nvme"]


def test_an_edited_deepspeed_json_changes_the_strategy(tmp_path):
    path, json_path = write_deepspeed_profile(tmp_path, {"stage": 3})
    assert load_strategy(path).offloaded == {} and load_strategy(path).compiled_by_default
    config = json.loads(json_path.read_text())
    config["zero_optimization"] = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    json_path.write_text(json.dumps(config))
    edited = load_strategy(path)
    assert (edited.zero_stage, edited.offloaded) == (2, {"optimizer": "cpu"})
    assert edited.speed_order > load_strategy("zero2").speed_order


def test_deepspeeds_linear_is_on_where_a_stage_3_json_leaves_it_to_deepspeeds_default(tmp_path):
    path, json_path = write_deepspeed_profile(tmp_path, {"stage": 3})
    assert load_strategy(path).deepspeed_linear
    config = json.loads(json_path.read_text())
    config["zero_optimization"]["memory_efficient_linear"] = False
    json_path.write_text(json.dumps(config))
    assert not load_strategy(path).deepspeed_linear


def test_no_shipped_profile_runs_deepspeeds_linear():
    """It made compiled Llama blocks recompile until they ran eager (docs/speed.md)."""
    assert not any(strategy.deepspeed_linear for strategy in shipped_strategies())


def test_a_deepspeed_json_asking_for_deepcompile_is_compiled_whole_by_deepspeed(tmp_path, monkeypatch):
    path, json_path = write_deepspeed_profile(tmp_path, {"stage": 3})
    assert not load_strategy(path).deepcompile
    config = json.loads(json_path.read_text())
    config["compile"] = {"deepcompile": True}
    json_path.write_text(json.dumps(config))
    strategy = load_strategy(path)
    assert strategy.deepcompile
    monkeypatch.delenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", raising=False)
    arguments = SimpleNamespace(torch_compile=True, torch_compile_mode=None, compile_loss=False)
    plan = CompilePlan.for_run(Launch(strategy), arguments, zero3_leaf_blocks=[])
    assert (plan.scope, plan.by_accelerate) == ("whole", True)


COMPILING = SimpleNamespace(torch_compile=True, torch_compile_mode=None, compile_loss=True)


@pytest.mark.parametrize("name", ["single", "ddp", "zero1", "zero2", "fsdp_grad_op", "fsdp"])
def test_every_profile_compiled_by_accelerate_asks_for_blocks(name):
    """The whole-model graph ran slower and held more than its blocks (docs/speed.md)."""
    assert load_profile(name).settings["dynamo_config"]["dynamo_use_regional_compilation"] is True


def compile_plan_of_launch(monkeypatch, profile: str, regional: str | None) -> CompilePlan:
    """The compile plan of a process that a 2-process launch of `profile` started, the launcher
    having set ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION to `regional` (None: left unset)."""
    loaded = load_profile(profile)
    if loaded.deepspeed_config_path is not None:
        monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
        monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(loaded.deepspeed_config_path))
    if regional is None:
        monkeypatch.delenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", regional)
    monkeypatch.setenv("WORLD_SIZE", "2")
    return CompilePlan.for_run(Launch.from_environment(), COMPILING, zero3_leaf_blocks=[])


@pytest.mark.parametrize("name", ["zero1", "zero2"])
def test_a_plain_deepspeed_launch_compiles_block_by_block_as_its_profile_asks(name, monkeypatch):
    """accelerate's DeepSpeed launcher drops the profile's dynamo_config and sets no variable."""
    plan = compile_plan_of_launch(monkeypatch, name, None)
    assert (plan.scope, plan.loss) == ("per_block", True)


def test_a_deepspeed_launch_told_not_to_compiles_the_whole_model(monkeypatch):
    plan = compile_plan_of_launch(monkeypatch, "zero2", "False")
    assert (plan.scope, plan.loss) == ("whole", False)


def test_ddp_launched_with_the_profiles_line_compiles_block_by_block(monkeypatch):
    assert compile_plan_of_launch(monkeypatch, "ddp", "True").scope == "per_block"


def test_ddp_without_the_launchers_variable_compiles_the_whole_model(monkeypatch):
    """accelerate's multi-GPU launcher always sets it; unset, nothing asked for blocks (torchrun)."""
    assert compile_plan_of_launch(monkeypatch, "ddp", None).scope == "whole"


def facts(strategy: Strategy) -> tuple:
    return (
        strategy.framework,
        strategy.sharded,
        strategy.offloaded,
        strategy.zero_stage,
        strategy.needs_nvme_path,
    )


def launched_on_two_processes(monkeypatch) -> Strategy:
    """The strategy a process of a 2-process launch reads from the launcher's variables."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    return Launch.from_environment().strategy


@pytest.mark.parametrize("name", ["zero1", "zero3", "zero2_offload", "zero3_nvme"])
def test_the_launched_deepspeed_strategy_is_the_profiles(name, monkeypatch):
    profile = load_profile(name)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(profile.deepspeed_config_path))
    launched = launched_on_two_processes(monkeypatch)
    assert (launched.name, facts(launched)) == (name, facts(profile.strategy))


@pytest.mark.parametrize("name", ["fsdp", "fsdp_grad_op"])
def test_the_launched_fsdp_strategy_is_the_profiles(name, monkeypatch):
    settings = load_profile(name).settings["fsdp_config"]
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", str(settings["fsdp_version"]))
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", str(settings["fsdp_reshard_after_forward"]).lower())
    launched = launched_on_two_processes(monkeypatch)
    assert (launched.name, facts(launched)) == (name, facts(load_strategy(name)))


@pytest.mark.parametrize("version", [None, "1"])
def test_a_launch_of_fsdp1_is_refused_in_one_line(version, monkeypatch):
    """A bare `accelerate launch` of a config without fsdp_version runs FSDP1 (accelerate's default)."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    if version:
        monkeypatch.setenv("FSDP_VERSION", version)
    with pytest.raises(FinetuneError, match="asks for FSDP version 1: this project trains with FSDP2"):
        launched_on_two_processes(monkeypatch)


def test_the_launched_strategy_carries_the_profiles_compile_mode(monkeypatch):
    """accelerate launch passes a profile's dynamo_mode on as ACCELERATE_DYNAMO_MODE."""
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", load_strategy("single").compile_mode)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert Launch.from_environment().strategy.records_cuda_graphs
    monkeypatch.delenv("ACCELERATE_DYNAMO_MODE")
    assert not Launch.from_environment().strategy.records_cuda_graphs


def test_the_launched_strategy_takes_the_name_finetune_run_gives_it(monkeypatch):
    assert launched_on_two_processes(monkeypatch).name == "ddp"
    monkeypatch.setenv("FINETUNE_PROFILE", "my_ddp")
    assert launched_on_two_processes(monkeypatch).name == "my_ddp"


def test_profiles_command_lists_strategies_fastest_first(capsys):
    assert main(["profiles"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [s.name for s in shipped_strategies()]
    assert lines[-1].startswith("zero3_nvme") and "moves optimizer states and parameters to" in lines[-1]


def test_readme_holds_the_generated_profiles_table():
    start, end = PROFILES_TABLE_MARKERS
    text = README.read_text()
    between = text[text.index(start) + len(start) : text.index(end)]
    assert between.strip() == profiles_table(shipped_strategies())


@pytest.mark.parametrize(
    ("zero", "problem"),
    [
        (
            {"stage": 3, "stage3_prefech_bucket_size": 5},
            "zero_optimization.stage3_prefech_bucket_size: Extra inputs",
        ),
        (
            {"stage": 2, "overlap_comm": "often"},
            "zero_optimization.overlap_comm: Input should be a valid boolean",
        ),
    ],
)
def test_a_zero_key_deepspeed_refuses_is_one_line_at_load(tmp_path, zero, problem):
    path, json_path = write_deepspeed_profile(tmp_path, zero)
    with pytest.raises(FinetuneError, match=problem) as error:
        load_profile(path)
    assert str(json_path.resolve()) in str(error.value)


def test_shipped_stage3_jsons_keep_torchs_linear():
    """DeepSpeed's own linear makes compiled blocks recompile per block (docs/profiles.md)."""
    for name in ("zero3", "zero3_offload", "zero3_nvme"):
        config = json.loads((shipped_folder("ds_configs") / f"{name}.json").read_text())
        assert config["zero_optimization"]["memory_efficient_linear"] is False, name


def test_every_shipped_deepspeed_json_passes_deepspeeds_own_check():
    for name in ("zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "zero3_nvme"):
        load_profile(name)


def test_shipped_zero12_profiles_reduce_in_deepspeeds_own_buckets_not_hidden_squared():
    """transformers' "auto" (hidden²) reduced each weight matrix alone: 1.2-2x slower (docs/speed.md)."""
    for name in ("zero1", "zero2", "zero2_offload"):
        assert load_strategy(name).reduce_bucket_values == 500_000_000, name


def test_zero12_gradient_reduce_buffers_are_read_from_the_deepspeed_json(tmp_path):
    shipped = load_strategy("zero2")
    assert (shipped.reduce_buffers, shipped.reduce_bucket_values) == (2, 500_000_000)
    (tmp_path / "auto").mkdir()
    path, _ = write_deepspeed_profile(tmp_path / "auto", {"stage": 1, "reduce_bucket_size": "auto"})
    auto = load_strategy(path)
    assert (auto.reduce_buffers, auto.reduce_bucket_values) == (1, None)  # overlap_comm is off by default
    (tmp_path / "scattered").mkdir()
    path, _ = write_deepspeed_profile(tmp_path / "scattered", {"stage": 2, "contiguous_gradients": False})
    assert load_strategy(path).reduce_buffers == 0


def test_zero3_keeps_one_gradient_reduce_buffer_whatever_overlap_comm_says():
    """stage3.py allocates one buffer per communication dtype; overlap_comm adds none."""
    zero3 = load_strategy("zero3")
    assert (zero3.reduce_buffers, zero3.reduce_bucket_values) == (1, 500_000_000)


def test_zero3s_optimizer_sub_groups_are_read_from_the_deepspeed_json(tmp_path):
    assert load_strategy("zero3").optimizer_sub_group_values == 1_000_000_000
    path, _ = write_deepspeed_profile(tmp_path, {"stage": 3, "sub_group_size": 1e8})
    assert load_strategy(path).optimizer_sub_group_values == 100_000_000
    assert load_strategy("zero2").optimizer_sub_group_values is None


def test_zero3s_gathered_weights_are_read_from_its_reuse_distance_and_live_limit(tmp_path):
    assert load_strategy("zero3").gathered_parameter_values == 1_000_000_000
    path, _ = write_deepspeed_profile(
        tmp_path, {"stage": 3, "stage3_max_reuse_distance": 2e8, "stage3_max_live_parameters": 3e8}
    )
    assert load_strategy(path).gathered_parameter_values == 200_000_000
    assert load_strategy("zero2").gathered_parameter_values is None


def test_sequence_parallel_gradients_reduce_in_fp32_unless_the_json_says_otherwise(tmp_path):
    """DeepSpeed's engine switches to seq_parallel_communication_data_type under Ulysses."""
    assert load_strategy("zero3").sequence_parallel_gradient_bytes == 4
    path, json_path = write_deepspeed_profile(tmp_path, {"stage": 3})
    config = json.loads(json_path.read_text())
    json_path.write_text(json.dumps({**config, "seq_parallel_communication_data_type": "bf16"}))
    assert load_strategy(path).sequence_parallel_gradient_bytes == 2


def test_an_unknown_communication_dtype_is_refused_in_one_line_naming_the_key(tmp_path):
    path, json_path = write_deepspeed_profile(tmp_path, {"stage": 3})
    config = json.loads(json_path.read_text())
    json_path.write_text(json.dumps({**config, "seq_parallel_communication_data_type": "int8"}))
    refused = "seq_parallel_communication_data_type: must be one of fp32, fp16, bf16, got 'int8'"
    with pytest.raises(FinetuneError, match=refused):
        load_profile(path)
