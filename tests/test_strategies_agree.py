"""The central promise: the strategy changes where the state lives, not what is trained.

With one seed and dropout off, the 2-rank reference runs (tests/runs.py) under ddp, fsdp, zero1,
zero2, zero3 and zero3_nvme (its parameters and optimizer states swapped through a folder) start from the
same weights on the same batch, so their step-1 losses agree to float32 rounding, and they follow
one loss curve: the pinned one in tests/data/reference_loss_curve.json.

Tolerances: the strategies sum gradients in different orders (all-reduce, reduce-scatter, bucketed
or not), and Adam's division by the root of the squared gradients lets that rounding grow a little
each step; on the CPU the curve was pinned on they stay within 1e-6 of each other over 20 steps.
CURVE_RTOL leaves room for other CPUs' float paths; a strategy that dropped or double-counted a
rank's gradients, or started from other weights, is off by percents within a few steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.summary import read_summary

from launching import accelerate_launch, launch
from runs import FLAGS, NO_CHECKPOINTS

PINNED = json.loads((Path(__file__).parent / "data" / "reference_loss_curve.json").read_text())
STRATEGIES = ["ddp", "fsdp", "zero1", "zero2", "zero3", "zero3_nvme"]
FIRST_STEP_RTOL = 1e-5
CURVE_RTOL = 1e-3

pytestmark = pytest.mark.integration


def loss_curve(output_dir: Path) -> dict[int, float]:
    return {point["step"]: point["loss"] for point in read_summary(output_dir)["loss_curve"]}


@pytest.mark.parametrize("profile", STRATEGIES)
def test_every_strategy_starts_from_the_same_weights(profile, reference_run):
    first_step = PINNED["steps"][0]
    assert loss_curve(reference_run(profile))[first_step] == pytest.approx(
        PINNED["losses"][0], rel=FIRST_STEP_RTOL
    )


@pytest.mark.parametrize("profile", STRATEGIES)
def test_every_strategy_follows_the_pinned_loss_curve(profile, reference_run):
    curve = loss_curve(reference_run(profile))
    assert list(curve) == PINNED["steps"]
    for step, expected in zip(PINNED["steps"], PINNED["losses"], strict=True):
        assert curve[step] == pytest.approx(expected, rel=CURVE_RTOL), step


def test_fsdp_units_of_one_block_prefetched_explicitly_follow_the_pinned_loss_curve(reference_run, tmp_path):
    """By default both blocks of the tiny model are one FSDP2 unit (fsdp's reference run); one unit
    per block, one all-gather each, the first issuing the second's as its forward starts, is the same
    training: units and prefetch move when parameters are gathered, not what is computed."""
    flags = [*FLAGS, *NO_CHECKPOINTS, "--fsdp_blocks_per_unit", "1", "--fsdp_prefetch", "1"]
    launch(accelerate_launch("fsdp"), tmp_path / "run", flags)
    one_per_block, reference = read_summary(tmp_path / "run"), read_summary(reference_run("fsdp"))
    assert (one_per_block["fsdp_units"], reference["fsdp_units"]) == (2, 1)
    assert (one_per_block["fsdp_prefetch"], reference["fsdp_prefetch"]) == (1, 0)
    curve = loss_curve(tmp_path / "run")
    for step, expected in zip(PINNED["steps"], PINNED["losses"], strict=True):
        assert curve[step] == pytest.approx(expected, rel=CURVE_RTOL), step
