"""DeepSpeed ZeRO's gradient norm in one multi-tensor kernel instead of a few operations a parameter.

Every optimizer step, DeepSpeed's ZeRO optimizers compute the norm they clip by from each parameter's
gradient partition in a Python loop: a cast to float64 and a norm (stage 3 a copy to the device
besides), queued one parameter at a time, then a non-finite total masked to -1 with a tensor copied
from the host. Sampled by py-spy in one-process runs of gpt2-medium, that loop was the largest part
of ZeRO-3's host time a step and a third of ZeRO-1's once its overflow check was off; ZeRO's steps
wait on their hosts (docs/speed.md). `torch._foreach_norm` (what torch's own `clip_grad_norm_`
calls) computes the same per-tensor norms in float64 in one launch per device and dtype; the sum of
their squares, the all-reduce over the partition group, the root and the -1 for a non-finite norm
stay DeepSpeed's. Written by hand: DeepSpeed has no switch for it. Runs that use what the loops
handle beyond that (tensor, pipeline or expert parallel groups, norms other than 2, gradients off the
device) keep DeepSpeed's own; the optimizer-offload paths never call it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from finetune.profiles import Strategy

Norm = Callable[..., torch.Tensor]


def _minus_one_if_not_finite(total: torch.Tensor) -> torch.Tensor:
    """DeepSpeed's -1 for a non-finite norm, as a scalar: its own copies a tensor from the host."""
    return torch.where(total.isnan().logical_or(total.isinf()), -1.0, total)


def stage3_one_kernel_norm(deepspeed_norm: Norm) -> Norm:
    """Stage 3's `get_grad_norm_direct` with the per-tensor norms in one `_foreach_norm`,
    `deepspeed_norm` wherever its loop does more than that."""
    from deepspeed import comm as dist
    from deepspeed.comm import pg_utils
    from deepspeed.runtime.zero.utils import get_norm_dtype

    def get_grad_norm_direct(
        optimizer: Any, gradients: Sequence[torch.Tensor], params: Sequence[Any], norm_type: float = 2
    ) -> torch.Tensor:
        device = torch.device(optimizer.device)  # DeepSpeed keeps its name, "cuda:0"
        if (
            float(norm_type) != 2.0
            or not gradients
            or pg_utils.is_parallel(optimizer.model_parallel_group)
            or optimizer._autoep_expert_parallel_group(params) is not None
            or any(gradient.device != device for gradient in gradients)
        ):
            return deepspeed_norm(optimizer, gradients, params, norm_type)
        optimizer._assert_same_partition_group(params)
        norms = torch._foreach_norm(list(gradients), 2.0, dtype=get_norm_dtype())
        total = torch.sum(torch.pow(torch.stack(norms), 2.0))
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=optimizer._get_param_partition_group(params[0]))
        return _minus_one_if_not_finite(total ** (1.0 / 2.0))

    get_grad_norm_direct.deepspeed_norm = deepspeed_norm  # type: ignore[attr-defined]
    return get_grad_norm_direct


def stage12_one_kernel_norm(deepspeed_norm: Norm) -> Norm:
    """Stages 1 and 2's `get_grad_norm_direct` with the per-tensor norms in one `_foreach_norm`,
    `deepspeed_norm` wherever its loop does more than that."""
    from deepspeed import comm as dist
    from deepspeed.comm import pg_utils
    from deepspeed.runtime.zero.utils import get_norm_dtype

    def get_grad_norm_direct(
        optimizer: Any, gradients: Sequence[torch.Tensor], params: Sequence[Any], norm_type: float = 2
    ) -> torch.Tensor:
        device = torch.device(optimizer.device)
        # DeepSpeed pairs the gradients but the padding's with the parameters, and counts those pairs
        counted = [gradient for gradient in gradients if not getattr(gradient, "_zero_padding", False)]
        counted = counted[: len(params)]
        if (
            float(norm_type) != 2.0
            or not counted
            or pg_utils.is_parallel(optimizer.model_parallel_group)
            or any(getattr(param, "ds_pipe_replicated", False) for param in params)
            or any(gradient.device != device for gradient in counted)
        ):
            return deepspeed_norm(optimizer, gradients, params, norm_type)
        norms = torch._foreach_norm(counted, 2.0, dtype=get_norm_dtype())
        total = torch.stack(norms).pow(2.0).sum().float()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=optimizer.dp_process_group)
        return _minus_one_if_not_finite(total.pow(1.0 / 2.0))

    get_grad_norm_direct.deepspeed_norm = deepspeed_norm  # type: ignore[attr-defined]
    return get_grad_norm_direct


def zero_norm_in_one_kernel(strategy: Strategy) -> bool:
    """Under a ZeRO profile (stages 1-3), this process's ZeRO optimizers of that stage take the
    one-kernel norm (before the Trainer builds its engine). Whether they do."""
    if strategy.zero_stage not in (1, 2, 3):
        return False
    if strategy.is_zero3:
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as optimizer_class

        one_kernel_norm = stage3_one_kernel_norm
    else:
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as optimizer_class

        one_kernel_norm = stage12_one_kernel_norm
    current = optimizer_class.get_grad_norm_direct
    if not hasattr(current, "deepspeed_norm"):
        optimizer_class.get_grad_norm_direct = one_kernel_norm(current)
    return True
