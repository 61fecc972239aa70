"""TensorBoard output, read back with TensorBoard's own event reader."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from transformers import TrainerControl, TrainerState, TrainingArguments

from finetune.reporting import GroupedTensorBoardCallback, tensorboard_tag


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
