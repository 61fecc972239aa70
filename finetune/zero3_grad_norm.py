"""ZeRO-3's gradient norm in one multi-tensor kernel instead of three operations a parameter.

Every optimizer step, DeepSpeed's stage-3 optimizer computes the norm it clips by (and checks for
overflow) from each parameter's gradient partition in a Python loop: a copy to the device, a cast to
float64 and a norm, queued one parameter at a time. Sampled by py-spy in a one-process ZeRO-3 run of
gpt2-medium, that loop was the largest part of the host's time a step, more than the forward's
parameter hooks; on several GPUs ZeRO-3's steps wait on their hosts (docs/speed.md).
`torch._foreach_norm` (what torch's own `clip_grad_norm_` calls) computes the same per-tensor norms in
float64 in one launch per device and dtype; the sum of their squares, the all-reduce over the
partition group, the root and the -1 for a non-finite norm stay DeepSpeed's. Written by hand:
DeepSpeed has no switch for it. Runs that use what the loop handles beyond that (tensor or expert
parallel groups, norms other than 2, gradients off the device) keep DeepSpeed's own loop; the
optimizer-offload path never calls it. It reads DeepSpeed internals (DEEPSPEED_INTERNALS_READ): a
DeepSpeed release without one of them keeps its own loop too, rather than failing at the first step.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from finetune.profiles import Strategy


def one_kernel_norm(deepspeed_norm: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`get_grad_norm_direct` with the per-tensor norms in one `_foreach_norm`, `deepspeed_norm`
    wherever the loop does more than that."""
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
        total = total ** (1.0 / 2.0)
        # DeepSpeed's -1 for a non-finite norm, as a scalar: its own copies a tensor from the host
        return torch.where(total.isnan().logical_or(total.isinf()), -1.0, total)

    get_grad_norm_direct.deepspeed_norm = deepspeed_norm  # type: ignore[attr-defined]
    return get_grad_norm_direct


# (module, class or None, names read from it) for each DeepSpeed internal one_kernel_norm uses.
DEEPSPEED_INTERNALS_READ = (
    ("deepspeed.comm.pg_utils", None, ("is_parallel",)),
    ("deepspeed.runtime.zero.utils", None, ("get_norm_dtype",)),
    (
        "deepspeed.runtime.zero.stage3",
        "DeepSpeedZeroOptimizer_Stage3",
        (
            "get_grad_norm_direct",
            "_autoep_expert_parallel_group",
            "_assert_same_partition_group",
            "_get_param_partition_group",
        ),
    ),
)


def deepspeed_has_the_internals_read() -> bool:
    for module_name, class_name, names in DEEPSPEED_INTERNALS_READ:
        try:
            found: Any = importlib.import_module(module_name)
        except ImportError:
            return False
        if class_name is not None:
            found = getattr(found, class_name, None)
        if found is None or not all(hasattr(found, name) for name in names):
            return False
    return True


def zero3_norm_in_one_kernel(strategy: Strategy) -> bool:
    """Under a ZeRO-3 profile, this process's stage-3 optimizers take the one-kernel norm (before the
    Trainer builds its engine), where this DeepSpeed has what it reads. Whether it did."""
    if not strategy.is_zero3 or not deepspeed_has_the_internals_read():
        return False
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    current = DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct
    if not hasattr(current, "deepspeed_norm"):
        DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct = one_kernel_norm(current)
    return True
