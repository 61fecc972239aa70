"""Python's garbage collector during training: timed on every rank, and held to step boundaries by
--gc_interval (on by default)."""

import gc

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from finetune.arguments import parse_arguments
from finetune.errors import FinetuneError
from finetune.garbage_collection import DEFAULT_GC_INTERVAL, YOUNG_GENERATIONS, GarbageCollectionCallback


class TickingClock:
    """Each reading one second after the last: every collection lasts exactly one second."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


@pytest.fixture
def events(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    return args, TrainerState(), TrainerControl()


@pytest.fixture(autouse=True)
def automatic_collection_restored():
    yield
    gc.enable()


def train(callback, events, steps):
    args, state, control = events
    callback.on_train_begin(args, state, control)
    for _ in range(steps):
        state.global_step += 1
        callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)


def test_collections_while_training_are_counted_and_timed(events):
    callback = GarbageCollectionCallback(clock=TickingClock())
    args, state, control = events
    callback.on_train_begin(args, state, control)
    gc.collect()
    callback.on_train_end(args, state, control)
    assert callback.ranks[0]["gc_full_collections"] >= 1
    assert callback.ranks[0]["gc_longest_s"] == 1.0
    assert callback.summary()["gc_seconds_max"] == callback.ranks[0]["gc_collections"] * 1.0


def test_collections_after_training_are_not_counted(events):
    callback = GarbageCollectionCallback(clock=TickingClock())
    train(callback, events, steps=0)
    counted = callback.ranks[0]["gc_collections"]
    gc.collect()
    assert callback.local()["gc_collections"] == counted


def test_an_interval_switches_automatic_collection_off_while_training_only(events):
    callback = GarbageCollectionCallback(interval=2)
    args, state, control = events
    callback.on_train_begin(args, state, control)
    assert not gc.isenabled()
    callback.on_train_end(args, state, control)
    assert gc.isenabled()


def test_an_interval_collects_the_young_generations_every_n_steps_and_after_the_first(events):
    """After step 1 (where the model compiles), then after steps 2 and 4."""
    callback = GarbageCollectionCallback(interval=2, clock=TickingClock())
    train(callback, events, steps=5)
    assert [generation for generation, _ in callback.pauses] == [YOUNG_GENERATIONS] * 3
    assert callback.summary()["gc_interval"] == 2


def test_a_resumed_run_collects_after_its_own_first_step(events):
    callback = GarbageCollectionCallback(interval=10, clock=TickingClock())
    events[1].global_step = 13  # resumed from checkpoint-13
    train(callback, events, steps=3)
    assert len(callback.pauses) == 1


def test_interval_zero_leaves_collection_automatic(events):
    callback = GarbageCollectionCallback(interval=0)
    args, state, control = events
    callback.on_train_begin(args, state, control)
    assert gc.isenabled()
    callback.on_train_end(args, state, control)


def test_a_training_that_raised_gets_automatic_collection_back_at_stop(events):
    """run.py stops the callback in a `finally`: a diverged or failed training never reaches its end."""
    callback = GarbageCollectionCallback(interval=2)
    callback.on_train_begin(*events)
    callback.stop()
    assert gc.isenabled()


def test_runs_collect_every_ten_steps_by_default(output_flags):
    _, _, training_args = parse_arguments(output_flags)
    assert training_args.gc_interval == DEFAULT_GC_INTERVAL == 10


def test_a_negative_interval_is_refused(output_flags):
    with pytest.raises(
        FinetuneError, match=r"^--gc_interval must be 0 or more \(0: automatic collection\), got -1$"
    ):
        parse_arguments([*output_flags, "--gc_interval", "-1"])
