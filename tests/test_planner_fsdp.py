"""finetune plan under the FSDP profiles: FSDP2's fp32 parameters sharded under both, and what it holds
unsharded in the compute dtype beside them (memory_model.fsdp_unsharded_gib), counted from torch's
FSDP2 code and checked against peaks measured on GPUs."""

import pytest

from finetune.arguments import parse_arguments
from finetune.calibration import blocks_per_unit, estimate_for, measured_calibration, read_measurements
from finetune.callbacks import GIB
from finetune.layout import ParallelLayout
from finetune.memory_model import (
    BACKWARD_END,
    BACKWARD_START,
    EVALUATION,
    OPTIMIZER_STEP,
    estimate,
    peak_phase,
)
from finetune.model_shapes import gpt2_shape
from finetune.planner import run_workload
from finetune.profiles import load_strategy
from finetune.workload import FSDP_BLOCKS_PER_UNIT, Workload

FSDP, FSDP_GRAD_OP = load_strategy("fsdp"), load_strategy("fsdp_grad_op")
CHECKPOINTED = Workload(1, 1024, gradient_checkpointing=True)


@pytest.fixture(scope="module")
def calibration():
    return measured_calibration()


@pytest.fixture(scope="module")
def gpt2_xl():
    return gpt2_shape("gpt2-xl")


def phase_parameters(strategy, shape, workload, calibration, phase: str, gpus: int = 1) -> float:
    return estimate(strategy, shape, workload, ParallelLayout(gpus), calibration).phases[phase][0]


def gathered_in(phase: str, strategy, shape, workload, calibration, gpus: int = 1) -> float:
    """What the parameters hold in `phase` beyond the optimizer step's (where FSDP2 holds no copy)."""
    in_phase, at_step = (
        phase_parameters(strategy, shape, workload, calibration, p, gpus) for p in (phase, OPTIMIZER_STEP)
    )
    return in_phase - at_step


def test_a_block_holds_every_parameter_but_the_token_embeddings(gpt2_xl):
    """GPT-2's positions and final norm spread over the blocks: within 0.2% of a block's own 12h²+13h."""
    assert gpt2_xl.block_parameters == (gpt2_xl.parameters - 50257 * 1600) // 48
    assert gpt2_xl.block_parameters == pytest.approx(12 * 1600**2 + 13 * 1600, rel=0.002)


@pytest.mark.parametrize("strategy", [FSDP, FSDP_GRAD_OP], ids=["fsdp", "fsdp_grad_op"])
def test_both_fsdp_profiles_keep_their_fp32_parameters_sharded(strategy, gpt2_xl, calibration):
    at_step = phase_parameters(strategy, gpt2_xl, Workload(8, 1024), calibration, OPTIMIZER_STEP, gpus=4)
    assert at_step == pytest.approx(4 * gpt2_xl.parameters / 4 / GIB)


def test_fsdp_grad_op_holds_every_weight_gathered_in_bf16_at_the_backwards_start(gpt2_xl, calibration):
    held = gathered_in(BACKWARD_START, FSDP_GRAD_OP, gpt2_xl, Workload(8, 1024), calibration, 4)
    assert held == pytest.approx(2 * gpt2_xl.parameters / GIB)


def test_fsdp_holds_only_the_roots_weights_gathered_at_the_backwards_start(gpt2_xl, calibration):
    """The root (here the embedding, tied to the output layer) stays gathered after the forward."""
    held = gathered_in(BACKWARD_START, FSDP, gpt2_xl, Workload(8, 1024), calibration, 4)
    assert held == pytest.approx(2 * 50257 * 1600 / GIB)


def test_the_backwards_end_holds_a_units_weights_its_gradients_and_the_earlier_units_reduce_input(
    gpt2_xl, calibration
):
    units = {size: phase_parameters(FSDP, gpt2_xl, Workload(1, 1024, fsdp_blocks_per_unit=size),
                                    calibration, BACKWARD_END) for size in (4, 12)}  # fmt: skip
    assert units[12] - units[4] == pytest.approx(3 * 8 * gpt2_xl.block_parameters * 2 / GIB)


def test_on_more_than_two_gpus_the_backward_peaks_with_its_prefetched_units_in_flight(gpt2_xl, calibration):
    """A unit further from the backward's end holds one more prefetched unit (2 bytes a value) and one
    unit's fp32 gradient shards fewer (4 bytes / 4 GPUs): half a unit more each, up to --fsdp_prefetch."""
    unit = FSDP_BLOCKS_PER_UNIT * gpt2_xl.block_parameters
    for prefetch, units in ((0, 3.5), (1, 3.5), (3, 4.5)):
        workload = Workload(1, 1024, fsdp_prefetch=prefetch)
        held = gathered_in(BACKWARD_END, FSDP, gpt2_xl, workload, calibration, 4)
        assert held == pytest.approx((50257 * 1600 + units * unit) * 2 / GIB), prefetch


@pytest.mark.parametrize("gpus", [1, 2])
def test_on_one_or_two_gpus_the_backward_peaks_at_its_last_unit_whatever_it_prefetched(
    gpus, gpt2_xl, calibration
):
    workloads = [Workload(1, 1024, fsdp_prefetch=ahead) for ahead in (0, 1, 3)]
    ends = {phase_parameters(FSDP, gpt2_xl, w, calibration, BACKWARD_END, gpus) for w in workloads}
    assert len(ends) == 1


def test_one_unit_of_every_block_leaves_no_earlier_units_reduce_input(gpt2_xl, calibration):
    one_unit = Workload(1, 1024, fsdp_blocks_per_unit=48)
    held = gathered_in(BACKWARD_END, FSDP, gpt2_xl, one_unit, calibration)
    assert held == pytest.approx((50257 * 1600 + 2 * 48 * gpt2_xl.block_parameters) * 2 / GIB)


def test_adapters_hold_only_gathered_weights_in_the_backward(gpt2_xl, calibration):
    """The frozen blocks make no gradients for FSDP2 to reduce: the unit that runs and the one
    prefetched, weights alone, whatever the GPUs."""
    unit = FSDP_BLOCKS_PER_UNIT * gpt2_xl.block_parameters
    for gpus in (1, 4):
        lora = gathered_in(BACKWARD_END, FSDP, gpt2_xl, Workload(1, 1024, peft="lora"), calibration, gpus)
        assert lora == pytest.approx((50257 * 1600 + 2 * unit) * 2 / GIB), gpus


def test_an_evaluation_under_fsdp_grad_op_holds_every_weight_gathered(gpt2_xl, calibration):
    """Its forward does not reshard, and no backward comes to."""
    held = gathered_in(EVALUATION, FSDP_GRAD_OP, gpt2_xl, Workload(8, 1024), calibration, 4)
    assert held == pytest.approx(2 * gpt2_xl.parameters / GIB)


def test_an_evaluation_under_fsdp_holds_the_root_the_running_unit_and_the_next(gpt2_xl, calibration):
    held = gathered_in(EVALUATION, FSDP, gpt2_xl, Workload(8, 1024), calibration, 4)
    units = 2 * FSDP_BLOCKS_PER_UNIT * gpt2_xl.block_parameters
    assert held == pytest.approx((50257 * 1600 + units) * 2 / GIB)


def test_other_frameworks_hold_nothing_unsharded_by_fsdp(gpt2_xl, calibration):
    for name in ("ddp", "zero2"):
        workloads = (Workload(1, 1024), Workload(1, 1024, fsdp_blocks_per_unit=48))
        strategy = load_strategy(name)
        ends = {phase_parameters(strategy, gpt2_xl, w, calibration, BACKWARD_END, 2) for w in workloads}
        assert len(ends) == 1, name


def test_fsdp_grad_op_holds_what_was_measured_beyond_fsdp_on_one_gpu(calibration):
    """Every pair of one-GPU peaks of the two profiles at the same model, micro batch and unit size,
    both predicted in the same phase: the difference is the bf16 copy of the blocks fsdp_grad_op
    keeps gathered (gpt2-xl: 2.75 GiB; none left at a checkpointed step's peak, at the backward's
    end). At gpt2-xl's micro batch 2 fsdp peaks at the backward's end, fsdp_grad_op at its start."""
    peaks: dict[tuple, dict[str, tuple[float, float]]] = {}
    for m in read_measurements():
        if m.strategy.framework == "fsdp" and m.layout.world_size == 1 and m.workload.peft is None:
            estimated = estimate_for(m, calibration)
            key = (m.shape.name, m.workload.micro_batch, m.workload.gradient_checkpointing,
                   m.workload.fsdp_blocks_per_unit, peak_phase(estimated.phases))  # fmt: skip
            peaks.setdefault(key, {})[m.strategy.name] = (m.peak_allocated_gib, estimated.total)
    pairs = [pair for pair in peaks.values() if len(pair) == 2]
    assert len(pairs) >= 10
    for pair in pairs:
        measured = pair["fsdp_grad_op"][0] - pair["fsdp"][0]
        predicted = pair["fsdp_grad_op"][1] - pair["fsdp"][1]
        assert predicted == pytest.approx(measured, abs=0.2), pair


def test_the_largest_30b_shape_on_four_gpus_is_predicted_within_2_percent(calibration):
    """`finetune plan --largest --gpus 4`'s gpt-30b, checkpointed at micro batch 1 on four H200:
    under fsdp its units of 4 blocks are 4.6 GiB of bf16 each (benchmarks/h200x4-2026-11-28c)."""
    rows = [m for m in read_measurements() if m.shape.name == "gpt-30b"]
    assert {m.strategy.name for m in rows} == {"fsdp", "zero3"}
    for m in rows:
        assert estimate_for(m, calibration).total == pytest.approx(m.peak_allocated_gib, rel=0.02), m


def test_a_plan_reads_the_runs_fsdp_units_and_prefetch():
    flags = ["--model", "gpt2-xl", "--output_dir", "unused"]
    default = run_workload(*parse_arguments(flags))[1]
    assert (default.fsdp_blocks_per_unit, default.fsdp_prefetch) == (FSDP_BLOCKS_PER_UNIT, 0)
    _, workload = run_workload(
        *parse_arguments([*flags, "--fsdp_blocks_per_unit", "12", "--fsdp_prefetch", "2"])
    )
    assert (workload.fsdp_blocks_per_unit, workload.fsdp_prefetch) == (12, 2)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"layers": 48, "fsdp_units": 12}, 4),
        ({"layers": 24, "fsdp_units": 5}, 5),  # the last unit the shorter
        ({"layers": 24, "fsdp_blocks_per_unit": 1}, 1),  # from before summaries recorded the units
        ({"layers": 24}, FSDP_BLOCKS_PER_UNIT),
    ],
)
def test_a_rows_blocks_per_unit_come_from_the_units_its_run_recorded(row, expected):
    assert blocks_per_unit(row) == expected
