"""AdamW stepped on each FSDP2 shard's local tensor (finetune/shard_optimizer.py): the same weights to
the bit as torch's AdamW through DTensor's dispatch, with the states still DTensors for checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from finetune.shard_optimizer import LocalShardAdamW


@pytest.fixture
def one_rank_group(tmp_path, monkeypatch):
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded_copy(model: torch.nn.Module) -> torch.nn.Module:
    model = copy.deepcopy(model)
    for layer in model:
        fully_shard(layer)
    return fully_shard(model)


def trained_weights(model: torch.nn.Module, optimizer_class: type, steps: int = 3) -> list[torch.Tensor]:
    optimizer = optimizer_class(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    torch.manual_seed(1)
    inputs = torch.randn(4, 8)
    for _ in range(steps):
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(isinstance(state["exp_avg"], DTensor) for state in optimizer.state.values())
    return [parameter.full_tensor() for parameter in model.parameters()]


def test_local_shard_adamw_steps_fsdp2_weights_as_torchs_adamw_does_to_the_bit(one_rank_group):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    through_dispatch = trained_weights(sharded_copy(model), torch.optim.AdamW)
    on_local_shards = trained_weights(sharded_copy(model), LocalShardAdamW)
    moved = [not torch.equal(a, b) for a, b in zip(on_local_shards, model.parameters(), strict=True)]
    assert all(moved)
    assert all(torch.equal(a, b) for a, b in zip(on_local_shards, through_dispatch, strict=True))
