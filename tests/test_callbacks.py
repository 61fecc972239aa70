"""The memory callback, driven event by event with readings of known size."""

import torch

from finetune.callbacks import MemoryCallback, across_ranks


def test_highest_rank_and_mean_across_ranks():
    assert across_ranks([1.0, 3.0, 2.0]) == {"max": 3.0, "rank": 1, "mean": 2.0}


class FakeMemory:
    """Readings that grow by one GiB per read, so every phase is distinguishable."""

    def __init__(self):
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return {
            "allocated": float(self.reads),
            "peak_allocated": float(self.reads),
            "host_rss": 0.5,
            "host_peak_rss": 1.0,
        }


def test_set_up_memory_is_read_when_training_begins(trainer_events):
    callback = MemoryCallback(read=FakeMemory())
    callback.on_train_begin(*trainer_events)
    callback.on_train_end(*trainer_events)
    assert callback.setup["peak_allocated"] == 1.0
    summary = callback.summary()
    assert summary["memory_setup_peak_allocated_gib_max"] == 1.0
    assert summary["memory_peak_allocated_gib_max"] == 2.0
    assert summary["memory_device"] == "cuda"


def test_memory_phases_of_the_first_step_in_order(trainer_events):
    model = torch.nn.Linear(2, 2)
    callback = MemoryCallback(profile_phases=True, read=FakeMemory())
    callback.mark_phase("model loaded")
    state = trainer_events[1]
    callback.on_train_begin(*trainer_events, model=model)
    model(torch.ones(1, 2))
    callback.on_pre_optimizer_step(*trainer_events)
    callback.on_optimizer_step(*trainer_events)
    state.global_step = 1
    model(torch.ones(1, 2))
    callback.on_pre_optimizer_step(*trainer_events)
    callback.on_train_end(*trainer_events)
    names = [name for name, _ in callback.phases]
    assert names == [
        "model loaded",
        "set-up (model placed, wrapped, optimizer built)",
        "first forward",
        "first backward",
        "first optimizer step",
    ]
    assert [reading["allocated"] for _, reading in callback.phases] == [1.0, 3.0, 4.0, 5.0, 6.0]
    assert "rank 0, first forward: allocated 4.00" in callback.report()


def test_memory_without_profiling_records_no_phases(trainer_events):
    callback = MemoryCallback(read=FakeMemory())
    callback.mark_phase("model loaded")
    callback.on_train_begin(*trainer_events, model=torch.nn.Linear(2, 2))
    assert callback.phases == []


def test_cpu_run_reports_host_memory_only(trainer_events):
    callback = MemoryCallback(read=lambda: {"host_rss": 0.5, "host_peak_rss": 0.75})
    callback.on_train_begin(*trainer_events)
    callback.on_train_end(*trainer_events)
    summary = callback.summary()
    assert summary["memory_device"] == "cpu"
    assert summary["memory_host_peak_rss_gib_max"] == 0.75
    assert "memory_peak_allocated_gib_max" not in summary
    assert set(callback.log_scalars()) == {
        "memory/host_rss_gib_max",
        "memory/host_rss_gib_mean",
        "memory/host_peak_rss_gib_max",
        "memory/host_peak_rss_gib_mean",
    }


def test_the_final_evaluation_has_its_own_gpu_peak_read_after_the_counters_restart():
    """Training's peak is recorded first; the evaluation's is the allocator's peak since the reset."""
    order = []
    readings = {"peak_allocated": 7.0}
    callback = MemoryCallback(read=lambda: dict(readings))

    def evaluate():
        order.append("evaluate")
        readings["peak_allocated"] = 9.5
        return {"eval_token_loss": 1.0}

    metrics, fields = callback.evaluation_peak(evaluate, reset=lambda: order.append("reset"))
    assert order == ["reset", "evaluate"]
    assert metrics == {"eval_token_loss": 1.0}
    assert fields == {"memory_eval_peak_allocated_gib_max": 9.5}


def test_a_cpu_run_has_no_evaluation_gpu_peak():
    callback = MemoryCallback(read=lambda: {"host_rss": 0.5, "host_peak_rss": 0.75})
    _, fields = callback.evaluation_peak(lambda: {}, reset=lambda: None)
    assert fields == {"memory_eval_peak_allocated_gib_max": None}
