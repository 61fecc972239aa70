"""The checks of `finetune doctor` that need no launch."""

from __future__ import annotations

from finetune.doctor import Check, memory_check, slurm_check, table


def test_a_slurm_job_with_fewer_nodes_than_machines_fails(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NNODES", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    check = slurm_check()
    assert (check.measured, check.passed) == ("1 node(s), 2 machine(s) launched", False)


def test_outside_slurm_there_is_no_slurm_row(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slurm_check() is None


def test_without_a_gpu_there_is_no_memory_row():
    assert memory_check(None, None, None) is None


def test_a_failed_check_says_no_and_what_to_do():
    row = table([Check("disk", "1 GiB free", ">= 9 GiB", False, "free space")]).splitlines()[-1]
    assert row == "| 0 | disk | 1 GiB free | >= 9 GiB | NO | free space |"
