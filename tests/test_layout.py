"""The layout of a launch's processes over parallel dimensions (finetune/layout.py)."""

from __future__ import annotations

import pytest

from finetune.activation_memory import sequence_exchange_gib
from finetune.calibration import measured_calibration
from finetune.callbacks import GIB
from finetune.errors import FinetuneError
from finetune.layout import ParallelLayout
from finetune.memory_model import estimate
from finetune.model_shapes import gpt2_shape
from finetune.planner import planned_strategies
from finetune.profiles import load_strategy
from finetune.workload import Workload


def test_every_process_is_a_data_parallel_rank_without_a_sequence_degree():
    layout = ParallelLayout(4)
    assert (layout.data_parallel_size, layout.shard_group_size, layout.devices) == (4, 4, 4)


def test_a_sequence_degree_divides_the_data_parallel_ranks_and_shards_over_all():
    layout = ParallelLayout(8, sequence_parallel=4)
    assert (layout.data_parallel_size, layout.shard_group_size, layout.devices) == (2, 8, 8)


def test_a_sequence_degree_that_does_not_divide_the_processes_is_refused():
    with pytest.raises(FinetuneError, match="sequence parallel degree of 3 does not divide the 4 processes"):
        ParallelLayout(4, sequence_parallel=3)


def test_a_launch_without_a_parallelism_config_is_data_parallel():
    assert ParallelLayout.from_environment(2, environ={}) == ParallelLayout(2)


def test_a_parallelism_config_of_plain_data_parallel_is_accepted():
    environ = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}
    environ |= {f"PARALLELISM_CONFIG_{d}_SIZE": "1" for d in ("DP_REPLICATE", "TP", "CP", "SP")}
    assert ParallelLayout.from_environment(2, environ=environ) == ParallelLayout(2)


@pytest.mark.parametrize("dimension", ["TP", "CP", "SP", "DP_REPLICATE"])
def test_a_profile_degree_finetune_does_not_train_with_is_refused_in_one_line(dimension):
    environ = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", f"PARALLELISM_CONFIG_{dimension}_SIZE": "2"}
    with pytest.raises(FinetuneError, match=f"parallelism_config sets {dimension.lower()}_size 2") as raised:
        ParallelLayout.from_environment(4, environ=environ)
    assert "\n" not in str(raised.value)


def test_the_planner_divides_sharded_states_by_the_shard_group_not_the_data_parallel_ranks():
    """A sequence group shares its samples but not its shards: ZeRO-3 states are per process."""
    shape, workload, zero3 = gpt2_shape("gpt2-xl"), Workload(8, 1024), load_strategy("zero3")
    calibration = measured_calibration()
    data_parallel = estimate(zero3, shape, workload, ParallelLayout(4), calibration)
    with_sequence_group = estimate(
        zero3, shape, workload, ParallelLayout(4, sequence_parallel=2), calibration
    )
    assert with_sequence_group.parameters == data_parallel.parameters
    assert with_sequence_group.optimizer == data_parallel.optimizer


def test_a_sequence_group_divides_a_ranks_activations_by_its_degree():
    """Each rank of the group holds its slice of every sample's tokens, plus Ulysses' exchange buffers."""
    shape, workload, zero3 = gpt2_shape("gpt2-xl"), Workload(8, 1024), load_strategy("zero3")
    calibration = measured_calibration()
    unsplit = estimate(zero3, shape, workload, ParallelLayout(4), calibration)
    split = estimate(zero3, shape, workload, ParallelLayout(4, sequence_parallel=4), calibration)
    exchange = sequence_exchange_gib(shape, workload, ParallelLayout(4, sequence_parallel=4))
    assert exchange == 8 * (8 * 1024 / 4) * 1600 * 2 / GIB  # bf16: q, k, v and the output, out and in
    assert split.activations == pytest.approx(unsplit.activations / 4 + exchange)


def test_ring_attention_adds_the_gathered_keys_values_and_their_gradients_of_the_whole_sequence():
    shape, workload, fsdp = gpt2_shape("gpt2-xl"), Workload(8, 1024), load_strategy("fsdp")
    calibration = measured_calibration()
    unsplit = estimate(fsdp, shape, workload, ParallelLayout(4), calibration)
    split = estimate(fsdp, shape, workload, ParallelLayout(4, sequence_parallel=4), calibration)
    exchange = sequence_exchange_gib(shape, workload, ParallelLayout(4, sequence_parallel=4), "ring")
    assert exchange == 4 * (8 * 1024) * 1600 * 2 / GIB  # bf16: k and v gathered, then their gradients
    assert split.activations == pytest.approx(unsplit.activations / 4 + exchange)


def test_a_sequence_group_is_planned_under_the_profiles_that_split_sequences_only():
    names = [s.name for s in planned_strategies(None, ParallelLayout(4, sequence_parallel=2))]
    assert names and all(load_strategy(name).splits_sequences for name in names)
    assert "zero3" in names and "fsdp" in names and "ddp" not in names
