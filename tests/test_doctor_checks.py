"""The checks of `finetune doctor` that need no launch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist

from finetune import doctor
from finetune.doctor import Check, memory_check, ops_needed, slurm_checks, table
from finetune.errors import FinetuneError
from finetune.launched import Launch
from finetune.outputs import check_claimable
from finetune.profiles import load_strategy
from finetune.run_folder import REPLACED_DIR


def test_a_slurm_job_with_fewer_nodes_than_machines_fails(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NNODES", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    nodes = slurm_checks(Launch.from_environment())[0]
    assert (nodes.measured, nodes.passed) == ("1 node(s), 2 machine(s) launched", False)


def test_a_slurm_job_with_several_tasks_per_node_fails(monkeypatch):
    job = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_NTASKS": "8", "WORLD_SIZE": "8"}
    job |= {"LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    for name, value in job.items():
        monkeypatch.setenv(name, value)
    checks = {check.name: check for check in slurm_checks(Launch.from_environment())}
    assert checks["SLURM nodes"].passed
    assert (checks["SLURM tasks"].passed, checks["SLURM tasks"].advice) == (
        False, "srun --ntasks-per-node=1 (as finetune slurm writes)"
    )  # fmt: skip
    assert checks["rendezvous"].measured == "node1:29500"


def test_outside_slurm_there_are_no_slurm_rows(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slurm_checks(Launch.from_environment()) == []


def test_without_a_gpu_there_is_no_memory_row():
    assert memory_check(None, None, None, Launch(load_strategy("ddp"))) is None


@pytest.mark.parametrize(
    ("profile", "on_gpu", "ops"),
    [
        ("ddp", True, []),
        ("fsdp", False, []),
        ("zero3", True, []),
        ("zero3", False, ["ShareMemCommBuilder"]),
        ("zero2_offload", True, ["CPUAdamBuilder"]),
        ("zero3_nvme", True, ["CPUAdamBuilder", "AsyncIOBuilder"]),
    ],
)
def test_the_deepspeed_ops_a_profile_builds_are_the_ones_checked(profile, on_gpu, ops):
    assert ops_needed(load_strategy(profile), on_gpu) == ops


def test_an_op_build_past_its_time_limit_fails_with_how_to_build_it_ahead(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(doctor, "OP_BUILD_LIMIT_S", 0.01)
    [check] = doctor.op_build_checks(load_strategy("zero2_offload"), on_gpu=True)
    assert (check.name, check.passed) == ("DeepSpeed op CPUAdamBuilder", False)
    assert check.advice.startswith("build it ahead")


RUN = SimpleNamespace(model="gpt2", config_overrides="n_layer=2,n_embd=64,n_head=2", peft=None, lora_rank=16,
                      lora_dropout=0.0, block_size=64, per_device_train_batch_size=2,
                      gradient_accumulation_steps=1, sequence_parallel=1, bf16=False, fp16=False,
                      gradient_checkpointing=False, torch_compile=False, chunked_loss=False,
                      ddp_gradient_as_bucket_view=False, fp8=False, fsdp_blocks_per_unit=None,
                      fsdp_prefetch=0, batch_flags_given=frozenset(), nvme_path=None)  # fmt: skip


def test_an_offload_profile_checks_host_ram_and_fails_when_it_is_short(monkeypatch):
    launch = Launch(load_strategy("zero3_offload"))
    check = doctor.host_memory_check(RUN, RUN, RUN, launch)
    assert check.passed
    monkeypatch.setattr(doctor.psutil, "virtual_memory", lambda: SimpleNamespace(available=0))
    assert not doctor.host_memory_check(RUN, RUN, RUN, launch).passed


def test_a_profile_without_offload_has_no_host_ram_row():
    assert doctor.host_memory_check(RUN, RUN, RUN, Launch(load_strategy("zero3"))) is None


def test_the_nvme_folder_is_timed_and_left_as_it_was(tmp_path):
    folder = tmp_path / "nvme"
    check = doctor.nvme_check(SimpleNamespace(nvme_path=str(folder)), load_strategy("zero3_nvme"), "cpu")
    assert check.measured.startswith("write ") and ", read " in check.measured
    assert list(folder.iterdir()) == []


def test_an_nvme_folder_slower_than_the_floor_fails(monkeypatch, tmp_path):
    monkeypatch.setattr(doctor, "NVME_FLOOR_GBPS", 1e9)
    check = doctor.nvme_check(SimpleNamespace(nvme_path=str(tmp_path)), load_strategy("zero3_nvme"), "cpu")
    assert (check.passed, check.advice.startswith("point --nvme_path")) == (False, True)


def test_a_link_slower_than_its_floor_fails_at_the_largest_size(monkeypatch, tmp_path):
    monkeypatch.setattr(doctor, "link_between_ranks", lambda launch, device_type: "network")
    monkeypatch.setattr(doctor, "BANDWIDTH_FLOOR_GBPS", {"network": 1e9})
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        checks = doctor.collective_checks(Launch(load_strategy("ddp")))
    finally:
        dist.destroy_process_group()
    judged = [check for check in checks if check.expected == "network: >= 1e+09 GB/s"]
    assert [check.name for check in judged] == ["all-reduce 16 MiB", "all-gather 16 MiB"]
    assert not any(check.passed for check in judged)
    assert all(check.passed for check in checks if check not in judged)


def test_a_failed_check_says_no_and_what_to_do():
    row = table([Check("disk", "1 GiB free", ">= 9 GiB", False, "free space")]).splitlines()[-1]
    assert row == "| 0 | disk | 1 GiB free | >= 9 GiB | NO | free space |"


def output_dir_row(tmp_path, *flags: str) -> Check:
    from finetune.arguments import parse_arguments

    model_args, _, training_args = parse_arguments(["--model", "gpt2", "--output_dir", str(tmp_path), *flags])
    return doctor.output_dir_check(model_args, training_args)


def test_an_output_dir_holding_another_runs_results_fails_as_the_run_would_refuse_it(tmp_path):
    (tmp_path / "run_summary.json").write_text('{"status": "completed", "steps": 10}')
    row = output_dir_row(tmp_path)
    with pytest.raises(FinetuneError) as refusal:
        check_claimable(tmp_path, resume=False, overwrite=False)
    assert not row.passed and row.measured == str(refusal.value)
    assert "holds another run's results (run_summary.json)" in row.measured and "--resume" in row.measured
    assert output_dir_row(tmp_path, "--resume").passed
    assert output_dir_row(tmp_path, "--overwrite_output_dir").passed


def test_results_a_killed_overwrite_run_set_aside_count_as_the_folders_results(tmp_path):
    """The next run puts them back before it judges the folder, so the row judges them too."""
    (tmp_path / REPLACED_DIR / "checkpoint-4").mkdir(parents=True)
    row = output_dir_row(tmp_path)
    assert not row.passed and "holds another run's results (checkpoint-4)" in row.measured


def test_an_empty_output_dir_passes_and_overwriting_the_model_read_fails(tmp_path):
    assert output_dir_row(tmp_path / "new").passed
    (tmp_path / "config.json").write_text("{}")
    row = output_dir_row(tmp_path, "--overwrite_output_dir", "--tokenizer", str(tmp_path))
    assert not row.passed and "would delete --tokenizer" in row.measured


def test_an_output_dir_that_cannot_be_written_fails_its_row(tmp_path, monkeypatch):
    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(doctor.tempfile, "NamedTemporaryFile", refused)
    row = output_dir_row(tmp_path / "new")
    assert not row.passed and "cannot write (Permission denied)" in row.measured
