"""What run.py sets in the environment on a GPU machine before CUDA starts (finetune/devices.py):
the allocator's expandable segments and NCCL's flight recorder, each only where the user set
neither of its names, under the name the installed torch reads without a warning."""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch

from finetune.devices import (
    ALLOCATOR_VARIABLES,
    EXPANDABLE_SEGMENTS,
    FLIGHT_RECORDER_VARIABLES,
    set_gpu_environment_defaults,
)

EVERY_NAME = (*ALLOCATOR_VARIABLES, *FLIGHT_RECORDER_VARIABLES)


@pytest.fixture
def clean_environment(monkeypatch):
    """Without any of the names; the environment as it was afterwards (what the function sets too)."""
    with mock.patch.dict(os.environ):
        for name in EVERY_NAME:
            os.environ.pop(name, None)
        yield monkeypatch


@pytest.fixture
def on_gpu(clean_environment):
    clean_environment.setattr(torch.cuda, "is_available", lambda: True)
    return clean_environment


def set_names() -> set[str]:
    return {name for name in EVERY_NAME if name in os.environ}


def test_a_gpu_run_gets_expandable_segments_and_the_flight_recorder_under_torchs_current_names(on_gpu):
    on_gpu.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.11.0"))
    set_gpu_environment_defaults()
    assert set_names() == {"PYTORCH_ALLOC_CONF", "TORCH_FR_BUFFER_SIZE"}
    assert os.environ["PYTORCH_ALLOC_CONF"] == EXPANDABLE_SEGMENTS


def test_a_torch_before_the_rename_gets_the_old_names(on_gpu):
    on_gpu.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.8.0"))
    set_gpu_environment_defaults()
    assert set_names() == {"PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_TRACE_BUFFER_SIZE"}


@pytest.mark.parametrize("name", ALLOCATOR_VARIABLES)
def test_the_users_allocator_settings_under_either_name_are_kept_alone(on_gpu, name):
    on_gpu.setenv(name, "max_split_size_mb:128")
    set_gpu_environment_defaults()
    assert os.environ[name] == "max_split_size_mb:128"
    assert set_names() & set(ALLOCATOR_VARIABLES) == {name}


def test_a_machine_without_a_gpu_gets_nothing(clean_environment):
    clean_environment.setattr(torch.cuda, "is_available", lambda: False)
    set_gpu_environment_defaults()
    assert set_names() == set()
