"""The throughput callback, driven event by event with a fake clock and batches of known size."""

import pytest
import torch
from datasets import Dataset

from finetune.flops import PeakFlops
from finetune.layout import ParallelLayout
from finetune.packing import pack_examples, packed_collator
from finetune.throughput import ThroughputCallback, WallClock, tokens_in, trained_tokens_in


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def batch(samples, length, padding=0):
    """Text samples right-padded as finetune.data pads them: masked out of attention and of the loss."""
    labels = torch.ones(samples, length, dtype=torch.long)
    mask = torch.ones(samples, length, dtype=torch.long)
    if padding:
        labels[:, length - padding :] = -100
        mask[:, length - padding :] = 0
    return {
        "input_ids": torch.ones(samples, length, dtype=torch.long),
        "attention_mask": mask,
        "labels": labels,
    }


def packed_batch(examples, block_size):
    """Instruction examples [(prompt length, answer length)] packed as finetune.data packs them."""
    rows = {"input_ids": [], "labels": []}
    for prompt, answer in examples:
        rows["input_ids"].append([7] * (prompt + answer))
        rows["labels"].append([-100] * prompt + [7] * answer)
    blocks, _ = pack_examples(Dataset.from_dict(rows), block_size, pad_token_id=0)
    return packed_collator([blocks[i] for i in range(len(blocks))])


def run_steps(callback, trainer_events, clock, durations, micro_batches, between=None):
    """Steps of the given durations; `between[i]` runs after step i ends (e.g. an evaluation)."""
    callback.on_train_begin(*trainer_events)
    for index, duration in enumerate(durations):
        callback.on_step_begin(*trainer_events)
        for micro_batch in micro_batches:
            callback.count_batch(micro_batch)
        clock.now += duration
        callback.on_step_end(*trainer_events)
        if between and index in between:
            between[index]()
    callback.on_train_end(*trainer_events)


def test_real_tokens_exclude_padding():
    assert int(tokens_in(batch(2, 10, padding=3))) == 2 * 7


def test_every_token_of_a_text_block_is_real():
    text = {"input_ids": torch.ones(2, 10, dtype=torch.long), "labels": torch.ones(2, 10, dtype=torch.long)}
    assert int(tokens_in(text)) == 2 * 10


def test_a_packed_blocks_real_tokens_are_its_examples_prompts_included():
    packed = packed_batch([(3, 2), (4, 1), (2, 2)], block_size=9)  # blocks of 5 + 4 and 4 (+ 5 padding)
    assert packed["input_ids"].shape == (2, 9)
    assert int(tokens_in(packed)) == 5 + 5 + 4


def test_a_full_packed_block_has_no_padding():
    assert int(tokens_in(packed_batch([(3, 2), (2, 2)], block_size=9))) == 9


def test_trained_tokens_are_the_answer_tokens():
    assert int(trained_tokens_in(packed_batch([(3, 2), (4, 1), (2, 2)], block_size=9))) == 2 + 1 + 2


def test_trained_tokens_of_text_leave_out_each_samples_first_token():
    assert int(trained_tokens_in(batch(2, 10, padding=3))) == 2 * 6


def test_the_rates_report_real_and_trained_tokens_apart(trainer_events):
    clock = FakeClock()
    callback = ThroughputCallback(warmup_steps=0, layout=ParallelLayout(), stopwatch=WallClock(clock))
    run_steps(callback, trainer_events, clock, [2.0], [packed_batch([(3, 2), (4, 1), (2, 2)], block_size=9)])
    summary = callback.summary()
    assert (summary["tokens_per_second"], summary["trained_tokens_per_second"]) == (14 / 2, 5 / 2)


def test_warm_up_steps_are_left_out(trainer_events):
    clock = FakeClock()
    callback = ThroughputCallback(warmup_steps=2, layout=ParallelLayout(), stopwatch=WallClock(clock))
    run_steps(callback, trainer_events, clock, [5.0, 3.0, 1.0, 1.0, 2.0], [batch(4, 8)])
    assert callback.step_times == [1.0, 1.0, 2.0]
    summary = callback.summary()
    assert summary["throughput_steps"] == 3
    assert summary["tokens_per_second"] == pytest.approx(3 * 32 / 4.0)
    assert summary["samples_per_second"] == pytest.approx(3 * 4 / 4.0)


def test_time_before_the_first_step_is_left_out(trainer_events):
    clock = FakeClock()
    callback = ThroughputCallback(warmup_steps=0, layout=ParallelLayout(), stopwatch=WallClock(clock))
    callback.on_train_begin(*trainer_events)
    clock.now += 100.0
    callback.on_step_begin(*trainer_events)
    callback.count_batch(batch(1, 8))
    clock.now += 2.0
    callback.on_step_end(*trainer_events)
    callback.on_train_end(*trainer_events)
    assert callback.step_times == [2.0]


def test_gradient_accumulation_counts_every_micro_batch_of_a_step(trainer_events):
    clock = FakeClock()
    callback = ThroughputCallback(warmup_steps=0, layout=ParallelLayout(), stopwatch=WallClock(clock))
    micro_batches = [batch(2, 8), batch(2, 8, padding=2), batch(2, 8)]
    run_steps(callback, trainer_events, clock, [2.0, 2.0], micro_batches)
    assert callback.step_tokens == [16 + 12 + 16] * 2
    assert callback.step_samples == [6, 6]
    assert callback.summary()["tokens_per_second"] == pytest.approx(44 / 2.0)


def test_steps_interrupted_by_evaluation_or_saving_are_left_out(trainer_events):
    clock = FakeClock()
    callback = ThroughputCallback(warmup_steps=0, layout=ParallelLayout(), stopwatch=WallClock(clock))

    def evaluate():
        clock.now += 50.0
        callback.on_evaluate(*trainer_events)

    def save():
        clock.now += 20.0
        callback.on_save(*trainer_events)

    run_steps(
        callback, trainer_events, clock, [1.0, 1.0, 1.0, 1.0], [batch(1, 8)], between={0: evaluate, 2: save}
    )
    assert callback.step_times == [1.0, 1.0]


def test_step_time_median_and_90th_percentile(trainer_events):
    clock = FakeClock()
    callback = ThroughputCallback(warmup_steps=0, layout=ParallelLayout(), stopwatch=WallClock(clock))
    run_steps(callback, trainer_events, clock, [1.0, 1.0, 2.0, 1.0], [batch(1, 8)])
    summary = callback.summary()
    assert summary["step_time_median_s"] == 1.0
    # numpy's linear interpolation on [1, 1, 1, 2]: position 0.9 * 3 = 2.7, so 1 + 0.7 * (2 - 1)
    assert summary["step_time_p90_s"] == pytest.approx(1.7)


def test_mfu_uses_the_per_device_token_rate(trainer_events):
    clock = FakeClock()
    peak = PeakFlops(tflops=1e-6, source="test")  # 1e6 FLOP/s
    callback = ThroughputCallback(
        0, ParallelLayout(), token_flops=1000, peak=peak, stopwatch=WallClock(clock)
    )
    run_steps(callback, trainer_events, clock, [2.0], [batch(1, 100)])
    summary = callback.summary()
    assert summary["tokens_per_second_per_device"] == 50.0
    assert summary["mfu"] == pytest.approx(1000 * 50.0 / 1e6)


def test_a_sequence_group_counts_each_sample_once_and_rates_per_device_per_process(trainer_events):
    """Two processes of one sequence group: each sees every sample, half of its tokens (here one
    process stands for both, its window the group's)."""
    clock = FakeClock()
    group = ParallelLayout(world_size=2, sequence_parallel=2)
    callback = ThroughputCallback(0, group, stopwatch=WallClock(clock))
    run_steps(callback, trainer_events, clock, [2.0], [batch(4, 8)])
    summary = callback.summary()
    assert summary["samples_per_second"] == pytest.approx(4 / 2 / 2.0)
    assert summary["tokens_per_second_per_device"] == pytest.approx(32 / 2.0 / 2)


def test_each_log_reports_only_the_steps_since_the_previous_log(trainer_events):
    clock = FakeClock()
    callback = ThroughputCallback(warmup_steps=0, layout=ParallelLayout(), stopwatch=WallClock(clock))
    run_steps(callback, trainer_events, clock, [1.0, 1.0], [batch(1, 8)])
    first = callback.log_scalars()
    clock.now += 4.0
    callback.count_batch(batch(1, 8))
    callback.on_step_end(*trainer_events)
    second = callback.log_scalars()
    assert first["throughput/tokens_per_second"] == pytest.approx(8.0)
    assert second["throughput/tokens_per_second"] == pytest.approx(2.0)
    assert second["throughput/step_time_s"] == 4.0


def test_training_forwards_are_counted_and_evaluation_forwards_are_not(trainer_events):
    model = torch.nn.Module()
    model.forward = lambda input_ids, attention_mask, labels: None
    callback = ThroughputCallback(warmup_steps=0, layout=ParallelLayout(), stopwatch=WallClock())
    callback.on_train_begin(*trainer_events, model=model)
    callback.on_step_begin(*trainer_events)
    model.train()
    model(**batch(2, 8))
    model.eval()
    model(**batch(5, 8))
    callback.on_step_end(*trainer_events)
    callback.on_train_end(*trainer_events)
    assert (callback.step_tokens, callback.step_samples) == ([16], [2])


def test_each_rank_records_its_slowest_steps_by_step_number(trainer_events):
    """Where a run's rate falls below its median step, the summary says which step took the time."""
    args, state, control = trainer_events
    clock = FakeClock()
    callback = ThroughputCallback(warmup_steps=1, layout=ParallelLayout(), stopwatch=WallClock(clock))
    callback.on_train_begin(args, state, control)
    for duration in [9.0, 1.0, 1.0, 4.0, 1.0, 2.0]:
        callback.on_step_begin(args, state, control)
        clock.now += duration
        state.global_step += 1
        callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)
    assert callback.ranks[0]["slowest_steps"][:2] == [[4, 4.0], [6, 2.0]]
    assert len(callback.ranks[0]["slowest_steps"]) == 5  # the warm-up step is not measured
