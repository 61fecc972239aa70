"""What `import finetune` sets before torch loads (finetune/startup_environment.py): torch's CPU
allocator on huge pages where no GPU is visible; the CUDA allocator's expandable segments and NCCL's
flight recorder where one is, under the names the installed torch reads without a warning. Each only
where the user set none of its names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from finetune.startup_environment import (
    ALLOCATOR_VARIABLES,
    EXPANDABLE_SEGMENTS,
    FLIGHT_RECORDER_ENTRIES,
    HUGE_PAGES_VARIABLE,
    set_startup_environment,
    torch_renamed_its_variables,
)

KERNEL_HUGE_PAGES = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# Allocates, touches and frees a 64 MiB tensor eight times (as a step's logits come and go) and prints
# the minor page faults that took: 4 KiB pages fault 16,384 times a tensor, huge pages 32 times.
FAULTS_OF_A_LARGE_TENSOR = """
import resource, sys
if sys.argv[1] == "finetune":
    import finetune
import torch
torch.ones(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    torch.empty(16 * 2**20).fill_(1.0)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


# Prints the huge-page variable as it was when torch began to import: a library imported before
# finetune's defaults could start CUDA, which reads its allocator's settings once.
ENVIRONMENT_WHEN_TORCH_LOADS = """
import importlib.abc, os, sys
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("at torch:", os.environ.get("THP_MEM_ALLOC_ENABLE"))
            sys.meta_path.remove(self)
sys.meta_path.insert(0, Watch())
import finetune
"""


def kernel_mode() -> str | None:
    """The kernel's transparent huge page mode (the bracketed word), None where it has none."""
    if not KERNEL_HUGE_PAGES.exists():
        return None
    chosen = re.search(r"\[(\w+)\]", KERNEL_HUGE_PAGES.read_text())
    return chosen.group(1) if chosen else None


def faults_of_a_large_tensor(first_import: str, environment: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", FAULTS_OF_A_LARGE_TENSOR, first_import],
        env=environment, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return int(done.stdout.split()[-1])


@pytest.fixture
def no_driver(tmp_path) -> Path:
    return tmp_path


@pytest.fixture
def driver_with_a_gpu(tmp_path) -> Path:
    (tmp_path / "0000:01:00.0").mkdir()
    return tmp_path


def test_huge_pages_are_asked_for_where_no_gpu_is_visible(no_driver):
    environment: dict[str, str] = {}
    set_startup_environment(environment, no_driver)
    assert environment == {HUGE_PAGES_VARIABLE: "1"}


def test_a_gpu_machine_gets_expandable_segments_and_the_flight_recorder_under_torchs_current_names(
    driver_with_a_gpu,
):
    environment: dict[str, str] = {}
    set_startup_environment(environment, driver_with_a_gpu, renamed=True)
    assert environment == {
        "PYTORCH_ALLOC_CONF": EXPANDABLE_SEGMENTS,
        "TORCH_FR_BUFFER_SIZE": FLIGHT_RECORDER_ENTRIES,
    }


def test_a_torch_before_the_rename_gets_the_old_names(driver_with_a_gpu):
    environment: dict[str, str] = {}
    set_startup_environment(environment, driver_with_a_gpu, renamed=False)
    assert set(environment) == {"PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_TRACE_BUFFER_SIZE"}


@pytest.mark.parametrize("name", ALLOCATOR_VARIABLES)
def test_the_users_allocator_settings_under_either_name_are_kept_alone(driver_with_a_gpu, name):
    environment = {name: "max_split_size_mb:128"}
    set_startup_environment(environment, driver_with_a_gpu, renamed=True)
    assert environment[name] == "max_split_size_mb:128"
    assert set(environment) & set(ALLOCATOR_VARIABLES) == {name}


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_gpus_hidden_from_the_process_count_as_none(driver_with_a_gpu, hidden):
    environment = {"CUDA_VISIBLE_DEVICES": hidden}
    set_startup_environment(environment, driver_with_a_gpu)
    assert environment[HUGE_PAGES_VARIABLE] == "1"


def test_the_users_own_huge_page_setting_is_kept(no_driver):
    environment = {HUGE_PAGES_VARIABLE: "0"}
    set_startup_environment(environment, no_driver)
    assert environment == {HUGE_PAGES_VARIABLE: "0"}


def test_importing_finetune_sets_the_defaults_before_torch_loads():
    environment = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", ENVIRONMENT_WHEN_TORCH_LOADS],
        env=environment, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    assert "at torch: 1" in done.stdout


def test_the_installed_torch_is_told_by_its_version_without_importing_it():
    assert torch_renamed_its_variables() == (torch.__version__ >= "2.9")


@pytest.mark.skipif(kernel_mode() not in ("madvise", "always"), reason="the kernel gives no huge pages")
def test_a_process_that_imports_finetune_first_faults_large_tensors_in_by_huge_pages():
    environment = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    assert faults_of_a_large_tensor("finetune", environment) < 8 * 16_384 // 8


@pytest.mark.skipif(kernel_mode() != "madvise", reason="huge pages only where a process asks for them")
def test_without_finetune_torch_faults_large_tensors_in_page_by_page():
    """The check above can fail: torch alone, unasked, takes the 4 KiB pages."""
    environment = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    assert faults_of_a_large_tensor("torch", environment) > 8 * 16_384 // 2
