"""TensorBoard output, read back with TensorBoard's own event reader."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2
from transformers import TrainerControl, TrainerState, TrainingArguments

from finetune.reporting import HPARAM_METRICS, GroupedTensorBoardCallback, run_scalars, tensorboard_tag


def read_events(log_dir):
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return events


@pytest.mark.parametrize(
    ("key", "tag"),
    [
        ("loss", "train/loss"),
        ("eval_perplexity", "eval/perplexity"),
        ("test_token_loss", "test/token_loss"),
        ("memory/peak_allocated_gib_max", "memory/peak_allocated_gib_max"),
        ("throughput/mfu", "throughput/mfu"),
    ],
)
def test_measurements_keep_their_group_and_the_rest_is_named_as_transformers_names_it(key, tag):
    assert tensorboard_tag(key) == tag


@pytest.fixture
def written_log(tmp_path):
    """A callback taken through train begin, one training log and one evaluation log."""
    log_dir = tmp_path / "runs" / "zero3-gpt2"
    callback = GroupedTensorBoardCallback(
        log_dir, {"profile": "zero3", "world_size": 2, "parameters": 124_439_808}
    )
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    state.global_step = 10
    callback.on_log(args, state, control, logs={"loss": 3.5, "throughput/tokens_per_second": 1234.0})
    callback.on_log(args, state, control, logs={"eval_perplexity": 33.0})
    callback.on_train_end(args, state, control)
    return log_dir


def test_scalars_are_written_under_their_groups(written_log):
    events = read_events(written_log)
    assert set(events.Tags()["scalars"]) == {"train/loss", "throughput/tokens_per_second", "eval/perplexity"}
    (point,) = events.Scalars("throughput/tokens_per_second")
    assert (point.step, point.value) == (10, 1234.0)


def test_run_configuration_is_written_as_hparams(written_log):
    events = read_events(written_log)
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["profile"].string_value == "zero3"
    assert hparams["world_size"].number_value == 2
    assert hparams["parameters"].number_value == 124_439_808
    assert hparams["deepspeed_version"].string_value == "None"


def test_run_configuration_is_written_as_text(written_log):
    events = read_events(written_log)
    assert "run_config/text_summary" in events.Tags()["tensors"]


def test_custom_scalars_layout_groups_memory_throughput_and_eval(written_log):
    events = read_events(written_log)
    content = events.PluginTagToContent("custom_scalars")
    assert content  # the layout summary is in the log
    (tensor,) = events.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(tensor.tensor_proto.string_val[0])
    assert [category.title for category in layout.category] == ["memory", "throughput", "eval"]


def test_hparams_metric_columns_are_the_whole_run_results(written_log):
    events = read_events(written_log)
    content = events.PluginTagToContent("hparams")["_hparams_/experiment"]
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
    assert [info.name.tag for info in experiment.metric_infos] == list(HPARAM_METRICS)


def test_run_scalars_use_gpu_memory_on_gpu_runs_and_host_memory_on_cpu_runs():
    fields = {
        "tokens_per_second_per_device": 100.0,
        "mfu": None,
        "memory_device": "cpu",
        "memory_peak_allocated_gib_max": None,
        "memory_host_peak_rss_gib_max": 1.5,
        "eval_perplexity": 30.0,
    }
    assert run_scalars(fields) == {
        "run/tokens_per_second_per_device": 100.0,
        "run/peak_memory_gib": 1.5,
        "run/eval_perplexity": 30.0,
    }
    gpu = {**fields, "memory_device": "cuda", "memory_peak_allocated_gib_max": 20.0}
    assert run_scalars(gpu)["run/peak_memory_gib"] == 20.0
