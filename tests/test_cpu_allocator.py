"""torch's CPU allocator on huge pages where no GPU is visible (finetune/cpu_allocator.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cpu_allocator import HUGE_PAGES_VARIABLE, huge_pages_without_gpus

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
    huge_pages_without_gpus(environment, no_driver)
    assert environment == {HUGE_PAGES_VARIABLE: "1"}


def test_a_machine_with_gpus_keeps_torchs_allocator(driver_with_a_gpu):
    environment: dict[str, str] = {}
    huge_pages_without_gpus(environment, driver_with_a_gpu)
    assert environment == {}


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_gpus_hidden_from_the_process_count_as_none(driver_with_a_gpu, hidden):
    environment = {"CUDA_VISIBLE_DEVICES": hidden}
    huge_pages_without_gpus(environment, driver_with_a_gpu)
    assert environment[HUGE_PAGES_VARIABLE] == "1"


def test_the_users_own_setting_is_kept(no_driver):
    environment = {HUGE_PAGES_VARIABLE: "0"}
    huge_pages_without_gpus(environment, no_driver)
    assert environment == {HUGE_PAGES_VARIABLE: "0"}


@pytest.mark.skipif(kernel_mode() not in ("madvise", "always"), reason="the kernel gives no huge pages")
def test_a_process_that_imports_finetune_first_faults_large_tensors_in_by_huge_pages():
    environment = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    assert faults_of_a_large_tensor("finetune", environment) < 8 * 16_384 // 8


@pytest.mark.skipif(kernel_mode() != "madvise", reason="huge pages only where a process asks for them")
def test_without_finetune_torch_faults_large_tensors_in_page_by_page():
    """The check above can fail: torch alone, unasked, takes the 4 KiB pages."""
    environment = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    assert faults_of_a_large_tensor("torch", environment) > 8 * 16_384 // 2
