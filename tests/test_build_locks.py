"""A build lock whose process is gone stops a DeepSpeed run in one line instead of a wait without end."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from finetune.build_locks import deepspeed_ops_a_run_builds, stale_build_locks, unbuilt
from finetune.launch_settings import announce_first_builds

from launching import ENVIRONMENT, PROJECT_ROOT, TINY_MODEL


def make_lock(root, op="deepspeed_shm_comm"):
    lock = root / "py311_cpu" / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    return lock


def test_a_lock_nobody_holds_is_stale(tmp_path):
    lock = make_lock(tmp_path)
    assert stale_build_locks(tmp_path) == [lock]


def test_a_lock_a_live_build_holds_open_is_not_stale(tmp_path):
    lock = make_lock(tmp_path)
    descriptor = os.open(lock, os.O_RDONLY)  # as torch's FileBaton keeps it during the build
    try:
        assert stale_build_locks(tmp_path) == []
    finally:
        os.close(descriptor)


def test_on_several_machines_a_young_unheld_lock_may_be_another_machines_build(tmp_path):
    make_lock(tmp_path)
    assert stale_build_locks(tmp_path, one_machine=False) == []


@pytest.mark.integration
def test_a_zero_run_with_a_stale_lock_fails_in_one_line_instead_of_waiting(tmp_path):
    lock = make_lock(tmp_path / "extensions")
    environment = {**ENVIRONMENT, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    command = [sys.executable, "-m", "finetune", "run", "--profile", "zero2", "--num_processes", "2",
               *TINY_MODEL, "--max_steps", "2", "--output_dir", str(tmp_path / "out")]  # fmt: skip
    result = subprocess.run(command, cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("finetune: error:")]
    assert errors == [
        f"finetune: error: {lock} is a build lock left by a process that no longer runs (killed while "
        f"building deepspeed_shm_comm); every DeepSpeed run would wait for it forever: remove it (rm {lock}) "
        "and run again"
    ]


def test_a_lock_held_only_by_a_stopped_process_is_named_with_its_pid(tmp_path, monkeypatch):
    """A build paused with Ctrl-Z holds its lock open: a run would wait for it, silently, for as long."""
    import signal
    import time

    from finetune.build_locks import build_lock_problem

    lock = make_lock(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(lock)!r}); import time; time.sleep(60)"])
    try:
        time.sleep(1.0)  # it has opened the lock
        holder.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
        problem = build_lock_problem(one_machine=True)
        assert problem is not None and f"held by stopped process(es) {holder.pid}" in problem
        assert f"kill -CONT {holder.pid}" in problem
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()


def test_doctor_does_not_wait_to_build_an_op_a_stale_lock_blocks(tmp_path, monkeypatch):
    from finetune import doctor
    from finetune.profiles import load_strategy

    make_lock(tmp_path)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    rows = doctor.op_build_checks(load_strategy("zero2_offload"), on_gpu=False)
    assert rows and all(not row.passed and "a build lock blocks it" in row.measured for row in rows)


def test_deepspeed_builds_its_shared_memory_collectives_on_cpu_and_cpu_adam_and_async_io_for_offload():
    to_nvme = {"device": "nvme"}
    nvme = {"zero_optimization": {"offload_optimizer": to_nvme, "offload_param": to_nvme}}
    cpu = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    assert deepspeed_ops_a_run_builds(on_gpu=False, deepspeed_config={}) == ["deepspeed_shm_comm"]
    assert deepspeed_ops_a_run_builds(on_gpu=True, deepspeed_config={}) == []
    assert deepspeed_ops_a_run_builds(on_gpu=True, deepspeed_config=cpu) == ["cpu_adam"]
    assert deepspeed_ops_a_run_builds(on_gpu=True, deepspeed_config=nvme) == ["cpu_adam", "async_io"]


def test_zero_plus_plus_quantized_collectives_build_the_quantizer_under_stage_3_on_gpus():
    quantized = {"stage": 3, "zero_quantized_weights": True}
    assert deepspeed_ops_a_run_builds(on_gpu=True, deepspeed_config={"zero_optimization": quantized}) == [
        "quantizer"
    ]
    stage_2 = {"zero_optimization": {**quantized, "stage": 2}}  # read by stage 3 only
    assert deepspeed_ops_a_run_builds(on_gpu=True, deepspeed_config=stage_2) == []


def test_an_op_counts_as_built_once_its_library_is_in_the_extensions_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = make_lock(tmp_path, "cpu_adam")  # a build under way: its folder, no library yet
    assert unbuilt(["cpu_adam", "async_io"]) == ["cpu_adam", "async_io"]
    (lock.parent / "cpu_adam.so").touch()
    assert unbuilt(["cpu_adam", "async_io"]) == ["async_io"]


def test_an_ops_first_build_is_announced_once_per_machine_by_its_first_process(tmp_path, monkeypatch, capsys):
    """Before the minute of silence the build takes; run before DeepSpeed starts (set_up_devices)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    for local_rank in (0, 1):
        announce_first_builds(SimpleNamespace(on_gpu=False, local_rank=local_rank), {})
    assert capsys.readouterr().out.count("finetune: DeepSpeed compiles deepspeed_shm_comm on first use") == 1


def test_an_op_built_before_is_not_announced(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (make_lock(tmp_path).parent / "deepspeed_shm_comm.so").touch()
    announce_first_builds(SimpleNamespace(on_gpu=False, local_rank=0), {})
    assert capsys.readouterr().out == ""
