"""The gradient clip on FSDP2's local shards (finetune/shard_clip.py): the norm and the clipped
gradients torch's clip gives through DTensor's dispatch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from finetune.shard_clip import clip_local_shards, sharded_gradients


@pytest.fixture
def one_rank_group(tmp_path, monkeypatch):
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded_with_gradients(model: torch.nn.Module) -> torch.nn.Module:
    model = copy.deepcopy(model)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    torch.manual_seed(1)
    (model(torch.randn(4, 8)) * 100).square().mean().backward()
    return model


@pytest.mark.parametrize("max_norm", [0.5, 1e6], ids=["clipped", "under the limit"])
def test_clip_on_local_shards_gives_torchs_norm_and_gradients(one_rank_group, max_norm):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    through_dispatch, on_shards = sharded_with_gradients(model), sharded_with_gradients(model)
    expected_norm = torch.nn.utils.clip_grad_norm_(list(through_dispatch.parameters()), max_norm)
    grads = sharded_gradients(on_shards.parameters())
    assert grads is not None
    norm = clip_local_shards(grads, max_norm)
    assert norm.item() > 0.5  # the clipped case scales
    torch.testing.assert_close(norm, expected_norm.full_tensor(), rtol=1e-6, atol=0)
    for ours, torchs in zip(on_shards.parameters(), through_dispatch.parameters(), strict=True):
        torch.testing.assert_close(ours.grad.full_tensor(), torchs.grad.full_tensor(), rtol=1e-6, atol=0)


def test_plain_gradients_are_left_to_torchs_clip():
    layer = torch.nn.Linear(4, 2)
    layer(torch.randn(3, 4)).sum().backward()
    assert sharded_gradients(layer.parameters()) is None
