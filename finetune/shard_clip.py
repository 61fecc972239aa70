"""The gradient clip on each FSDP2 rank's local shards.

torch's `clip_grad_norm_` takes one norm per parameter and moves each to the first device: under
FSDP2 every gradient is a DTensor, so each of those per-parameter ops (the norm, its `.to`, the
stack, the scaling) goes through DTensor's dispatch on the host. The same clip on the local shards
is one foreach norm, one all-reduce of the summed squares over the shard group and one foreach
scaling, the coefficient torch's own formula gives. Written here because neither torch nor
accelerate clips local shards.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def sharded_gradients(parameters: Iterable[torch.nn.Parameter]) -> list[DTensor] | None:
    """The gradients when all are DTensors sharded over one 1-D mesh (FSDP2's layout); None
    for any other layout (replicated or 2-D meshes, plain tensors), which torch's clip keeps."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads or not all(isinstance(grad, DTensor) for grad in grads):
        return None
    meshes = {grad.device_mesh for grad in grads}
    if len(meshes) != 1 or next(iter(meshes)).ndim != 1:
        return None
    if not all(placement.is_shard() for grad in grads for placement in grad.placements):
        return None
    return grads


def clip_local_shards(grads: list[DTensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients by min(max_norm / (norm + 1e-6), 1), as torch's clip does, and return
    the norm of all of them (a plain tensor, the same on every rank)."""
    local = [grad.to_local() for grad in grads]
    norms = torch._foreach_norm(local, 2.0)
    squared = torch.stack([norm.float() for norm in norms]).square().sum()
    mesh = grads[0].device_mesh
    if mesh.size() > 1:
        dist.all_reduce(squared, group=mesh.get_group())
    total_norm = squared.sqrt()
    coefficient = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    torch._foreach_mul_(local, coefficient.to(local[0].dtype))
    return total_norm
