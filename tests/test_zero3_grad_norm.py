"""ZeRO-3's gradient norm in one multi-tensor kernel (finetune/zero3_grad_norm.py): DeepSpeed's value,
from a real stage-3 optimizer on one gloo process."""

from __future__ import annotations

import pytest

from finetune.profiles import load_strategy
from finetune.zero3_grad_norm import zero3_norm_in_one_kernel

from launching import TINY_DEEPSPEED_ENGINE, one_process_script

NORMS_SCRIPT = (
    TINY_DEEPSPEED_ENGINE
    + """
import json, math
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3
from finetune.profiles import load_strategy
from finetune.zero3_grad_norm import zero3_norm_in_one_kernel
deepspeeds = Stage3.get_grad_norm_direct
installed = [zero3_norm_in_one_kernel(load_strategy("zero3")) for _ in range(2)]
config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
          "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": 3}}
engine, ids = tiny_gpt2_engine(config)
engine.backward(engine(input_ids=ids, labels=ids).loss)
zero = engine.optimizer
gradients, params = zero.averaged_gradients[0], zero.fp16_groups[0]
not_finite = [g.clone() for g in gradients]
not_finite[0].view(-1)[0] = math.inf
result = {
    "installed": installed,
    "wraps_deepspeeds": Stage3.get_grad_norm_direct.deepspeed_norm is deepspeeds,
    "tensors": len(gradients),
    "one_kernel": Stage3.get_grad_norm_direct(zero, gradients, params).item(),
    "deepspeed": deepspeeds(zero, gradients, params).item(),
    "not_finite": [Stage3.get_grad_norm_direct(zero, not_finite, params).item(),
                   deepspeeds(zero, not_finite, params).item()],
    "max_norm": [Stage3.get_grad_norm_direct(zero, gradients, params, math.inf).item(),
                 deepspeeds(zero, gradients, params, math.inf).item()],
}
engine.step()
result["stepped"] = float(engine.get_global_grad_norm())
print(json.dumps(result))
"""
)


@pytest.fixture(scope="module")
def norms() -> dict:
    """One backward of a tiny GPT-2 under a real ZeRO-3 engine, its gradient partitions' norm taken
    both ways, then the step's own norm."""
    return one_process_script(NORMS_SCRIPT)


@pytest.mark.integration
def test_the_one_kernel_norm_is_deepspeeds_norm_of_every_gradient_partition(norms):
    assert norms["tensors"] > 10  # a tensor a parameter: the loop the kernel replaces
    assert norms["one_kernel"] == pytest.approx(norms["deepspeed"], rel=1e-12)
    assert norms["one_kernel"] > 0


@pytest.mark.integration
def test_the_zero3_optimizer_step_clips_by_the_one_kernel_norm(norms):
    assert norms["installed"] == [True, True]
    assert norms["stepped"] == pytest.approx(norms["one_kernel"], rel=1e-6)


@pytest.mark.integration
def test_a_non_finite_gradient_gives_deepspeeds_minus_one(norms):
    assert norms["not_finite"] == [-1.0, -1.0]


@pytest.mark.integration
def test_installing_twice_still_wraps_deepspeeds_own_loop_and_other_norms_use_it(norms):
    assert norms["wraps_deepspeeds"]
    assert norms["max_norm"][0] == norms["max_norm"][1]


@pytest.mark.parametrize(
    "profile", ["single", "ddp", "zero1", "zero2", "zero2_offload", "fsdp", "fsdp_grad_op"]
)
def test_profiles_without_zero3_keep_deepspeeds_norm(profile):
    assert zero3_norm_in_one_kernel(load_strategy(profile)) is False


def test_a_deepspeed_without_an_internal_it_reads_keeps_its_own_norm(monkeypatch):
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    deepspeeds = DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct
    monkeypatch.delattr(DeepSpeedZeroOptimizer_Stage3, "_autoep_expert_parallel_group")
    assert zero3_norm_in_one_kernel(load_strategy("zero3")) is False
    assert DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct is deepspeeds
