"""TensorBoard: the run's measurements under their own groups, and its configuration as hparams.

transformers' TensorBoardCallback files every training log under `train/`; this subclass keeps
`memory/` and `throughput/` as groups of their own, writes into `<output_dir>/runs/<run_name>`,
and records the run's configuration (profile, world size, model, batch, dtype, versions, GPU) as
text and as HParams, so runs of different profiles line up in one `tensorboard --logdir`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.tensorboard.summary import hparams
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback
from transformers.integrations.integration_utils import rewrite_logs

from finetune.summary import peak_memory

HPARAM_FIELDS = (
    "profile",
    "strategy",
    "world_size",
    "num_hosts",
    "model",
    "parameters",
    "block_size",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "global_batch_size",
    "learning_rate",
    "dtype",
    "gradient_checkpointing",
    "device_name",
    "torch_version",
    "transformers_version",
    "accelerate_version",
    "deepspeed_version",
)
# Whole-run results, logged once when the run ends (run_scalars) and shown as the HParams
# dashboard's metric columns beside each run's configuration.
HPARAM_METRICS = (
    "run/tokens_per_second_per_device",
    "run/mfu",
    "run/peak_memory_gib",
    "run/eval_perplexity",
)
# The Custom Scalars dashboard: one chart per question, every run's line on it (tags are regexes).
LAYOUT = {
    "memory": {
        "GPU peak allocated, max and mean over ranks (GiB)": ["Multiline", [r"memory/peak_allocated_gib_.*"]],
        "GPU peak reserved, max over ranks (GiB)": ["Multiline", [r"memory/peak_reserved_gib_max"]],
        "host peak RSS, max and mean over ranks (GiB)": ["Multiline", [r"memory/host_peak_rss_gib_.*"]],
    },
    "throughput": {
        "tokens/s per device": ["Multiline", [r"throughput/tokens_per_second_per_device"]],
        "MFU": ["Multiline", [r"throughput/mfu"]],
        "step time (s)": ["Multiline", [r"throughput/step_time_s"]],
    },
    "eval": {
        "perplexity": ["Multiline", [r"eval/perplexity"]],
        "training loss": ["Multiline", [r"train/loss"]],
    },
}


def run_scalars(fields: dict[str, Any]) -> dict[str, float]:
    """The run summary's headline numbers as `run/` scalars (null ones left out)."""
    values = {
        "run/tokens_per_second_per_device": fields["tokens_per_second_per_device"],
        "run/mfu": fields["mfu"],
        "run/peak_memory_gib": peak_memory(fields)[1],
        "run/eval_perplexity": fields["eval_perplexity"],
    }
    return {name: value for name, value in values.items() if value is not None}


def tensorboard_tag(key: str) -> str:
    """`memory/x` stays; `loss` becomes `train/loss`, `eval_loss` `eval/loss`, as transformers names them."""
    if "/" in key:
        return key
    return next(iter(rewrite_logs({key: None})))


def hparam_value(value: Any) -> int | float | str | bool:
    return value if isinstance(value, (int, float, str, bool)) else str(value)


def config_markdown(config: dict[str, Any]) -> str:
    rows = [f"| {name} | {value} |" for name, value in config.items()]
    return "\n".join(["| setting | value |", "|---|---|", *rows])


class GroupedTensorBoardCallback(TensorBoardCallback):
    """Replaces transformers' TensorBoardCallback (same writer, same TENSORBOARD_LOGGING_DIR override)."""

    def __init__(self, logging_dir: str | Path, run_config: dict[str, Any], purge_step: int | None = None):
        super().__init__()
        self.logging_dir = self.logging_dir or str(logging_dir)
        self.run_config = {name: run_config.get(name) for name in HPARAM_FIELDS}
        self.purge_step = purge_step

    def _init_summary_writer(self, args: TrainingArguments) -> None:
        """A resumed run continues its TensorBoard run; steps logged after its checkpoint are dropped."""
        self.tb_writer = self._SummaryWriter(log_dir=self.logging_dir, purge_step=self.purge_step)
        self.purge_step = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        super().on_train_begin(args, state, control, **kwargs)
        if state.is_world_process_zero and self.tb_writer is not None:
            self.tb_writer.add_text("run_config", config_markdown(self.run_config))
            experiment, session_start, session_end = hparams(
                {name: hparam_value(value) for name, value in self.run_config.items()},
                dict.fromkeys(HPARAM_METRICS, 0.0),
            )
            writer = self.tb_writer._get_file_writer()
            for summary in (experiment, session_start, session_end):
                writer.add_summary(summary)
            self.tb_writer.add_custom_scalars(LAYOUT)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not state.is_world_process_zero:
            return
        if self.tb_writer is None:
            self._init_summary_writer(args)
        for key, value in (logs or {}).items():
            if isinstance(value, (int, float)):
                self.tb_writer.add_scalar(tensorboard_tag(key), value, state.global_step)
        self.tb_writer.flush()


def read_scalars(log_root: str | Path) -> Any:
    """Every scalar of every TensorBoard run under `log_root`, as a long pandas DataFrame
    (run, tag, step, value), read with TensorBoard's own event reader."""
    import pandas as pd
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = []
    run_dirs = sorted({path.parent for path in Path(log_root).rglob("events.out.tfevents.*")})
    for run_dir in run_dirs:
        events = EventAccumulator(str(run_dir))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            rows += [
                {"run": run_dir.name, "tag": tag, "step": point.step, "value": point.value}
                for point in events.Scalars(tag)
            ]
    return pd.DataFrame(rows, columns=["run", "tag", "step", "value"])
