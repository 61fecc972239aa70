"""The launch is resolved once from the launcher's environment (finetune/launched.py) and held to the
Accelerator the Trainer sets up: every run checks them against each other (`Launch.check_against`)
and stops in one line when they differ, so a completed run on every profile is the agreement."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from accelerate.utils import DynamoBackend

from finetune.devices import one_gpu_per_process
from finetune.errors import FinetuneError
from finetune.launched import CompilePlan, Launch
from finetune.layout import ParallelLayout
from finetune.profiles import available_profiles, load_strategy
from finetune.summary import read_summary

from launching import TINY_MODEL, accelerate_launch, launch
from runs import PROFILES as REFERENCE_PROFILES

SHORT_RUN = [*TINY_MODEL, "--block_size", "32", "--batch_size", "2", "--max_steps", "1",
             "--max_eval_samples", "4", "--save_strategy", "no", "--report_to", "none"]  # fmt: skip
EVERY_PROFILE = sorted(Path(path).stem for path in available_profiles())


def fake_accelerator(processes: int, zero_stage: int | None = None) -> SimpleNamespace:
    """What Launch.check_against reads of an Accelerator: DDP, or DeepSpeed at a ZeRO stage."""
    plugin = None
    if zero_stage is not None:
        plugin = SimpleNamespace(deepspeed_config={"zero_optimization": {"stage": zero_stage}})
    dynamo = SimpleNamespace(backend=DynamoBackend.NO, use_regional_compilation=False, mode=None)
    state = SimpleNamespace(deepspeed_plugin=plugin, fsdp_plugin=None, dynamo_plugin=dynamo)
    return SimpleNamespace(state=state, num_processes=processes)


def test_every_shipped_profile_is_launched_by_the_agreement_runs():
    assert set(EVERY_PROFILE) == {*REFERENCE_PROFILES, "fsdp_grad_op", "zero3_offload", "single"}


@pytest.mark.integration
@pytest.mark.parametrize("profile", REFERENCE_PROFILES)
def test_the_launch_read_from_the_environment_is_what_accelerate_set_up(profile, reference_run):
    summary = read_summary(reference_run(profile))
    assert (summary["status"], summary["strategy"], summary["world_size"]) == ("completed", profile, 2)


@pytest.mark.integration
@pytest.mark.parametrize(("profile", "processes"), [("fsdp_grad_op", 2), ("zero3_offload", 2), ("single", 1)])
def test_the_other_profiles_launch_what_accelerate_sets_up(profile, processes, tmp_path):
    output_dir = tmp_path / "out"
    launch(accelerate_launch(profile, processes), output_dir, SHORT_RUN)
    summary = read_summary(output_dir)
    expected = (profile, processes, processes)
    assert (summary["strategy"], summary["world_size"], summary["data_parallel_size"]) == expected


def test_a_launch_accelerate_set_up_differently_stops_in_one_line():
    zero2 = Launch(load_strategy("zero2"), ParallelLayout(2))
    expected = r"^the launch was read as zero2 on 2 processes but accelerate set up zero3 on 2"
    with pytest.raises(FinetuneError, match=expected):
        zero2.check_against(fake_accelerator(2, zero_stage=3), CompilePlan())


def test_a_launch_on_other_processes_than_accelerates_stops():
    with pytest.raises(FinetuneError, match="on 2 processes but accelerate set up ddp on 4"):
        Launch(load_strategy("ddp"), ParallelLayout(2)).check_against(fake_accelerator(4), CompilePlan())


def test_a_compile_plan_accelerate_does_not_follow_stops():
    with pytest.raises(FinetuneError, match=r"^the compile plan \(whole, mode default\) disagrees"):
        Launch(load_strategy("ddp"), ParallelLayout(2)).check_against(
            fake_accelerator(2), CompilePlan("whole", "default")
        )


def test_the_same_launch_passes():
    Launch(load_strategy("zero2"), ParallelLayout(2)).check_against(
        fake_accelerator(2, zero_stage=2), CompilePlan()
    )


PROCESS_VARIABLES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK")


def test_the_process_layout_is_read_from_the_launchers_variables(monkeypatch):
    for name, value in zip(PROCESS_VARIABLES, ("4", "2", "3", "1"), strict=True):
        monkeypatch.setenv(name, value)
    launch = Launch.from_environment()
    layout = (launch.world_size, launch.processes_per_machine, launch.rank, launch.local_rank)
    assert layout == (4, 2, 3, 1)
    assert (launch.by_launcher, launch.machines, launch.on_one_machine) == (True, 2, False)


def test_a_process_started_without_a_launcher_is_rank_0_alone_on_one_machine(monkeypatch):
    for name in PROCESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    launch = Launch.from_environment()
    assert (launch.world_size, launch.rank, launch.by_launcher, launch.on_one_machine) == (1, 0, False, True)


def test_fsdp_on_one_cpu_rank_is_set_up_as_cpu_fsdp_only_when_a_launcher_started_it():
    fsdp = load_strategy("fsdp")
    assert Launch(fsdp, by_launcher=True).fsdp_on_cpu
    assert not Launch(fsdp, by_launcher=False).fsdp_on_cpu
    assert not Launch(fsdp, by_launcher=True, on_gpu=True).fsdp_on_cpu
    assert not Launch(load_strategy("ddp"), ParallelLayout(2), by_launcher=True).fsdp_on_cpu


def test_only_launched_reads_the_launchers_process_variables():
    """errors.py is the exception: it reports errors raised before, or while, the Launch is built."""
    readers = {
        path.name
        for path in (Path(__file__).resolve().parents[1] / "finetune").glob("*.py")
        if any(f'"{name}"' in path.read_text() for name in PROCESS_VARIABLES)
    }
    assert readers == {"launched.py", "errors.py"}


def test_a_lone_process_on_a_machine_of_several_gpus_trains_on_one_not_dataparallel(capsys):
    """transformers would wrap the model in nn.DataParallel over every visible GPU (n_gpu > 1)."""
    args = SimpleNamespace(n_gpu=4, _n_gpu=4, device="cuda:0")
    one_gpu_per_process(args, Launch(load_strategy("single"), on_gpu=True))
    assert args._n_gpu == 1
    assert capsys.readouterr().out == (
        "finetune: single trains on one GPU of the 4 visible (cuda:0); a profile of several processes "
        "(ddp, fsdp, zero*) uses them all\n"
    )


def test_a_process_with_one_gpu_or_none_is_left_as_transformers_set_it(capsys):
    one_gpu, cpu_only = SimpleNamespace(n_gpu=1, _n_gpu=1), SimpleNamespace(n_gpu=0, _n_gpu=0)
    for args, on_gpu in ((one_gpu, True), (cpu_only, False)):
        one_gpu_per_process(args, Launch(load_strategy("single"), on_gpu=on_gpu))
        assert args._n_gpu == args.n_gpu
    assert capsys.readouterr().out == ""
