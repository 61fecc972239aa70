"""The project's Trainer: transformers.Trainer with two documented-style overrides.

- `log` adds the measuring callbacks' scalars to the training logs, so every `report_to`
  integration and `state.log_history` receive them (a callback's `on_log` cannot: the integrations
  come first in the Trainer's callback list, and log_history is written before any callback runs).
- `log` also warns when a logged gradient norm is exactly 0: such a run updates nothing (all labels
  masked, or a loss or compile path that lost the gradients), however fast it looks.
- `get_train_dataloader` drops the last, smaller batch of each epoch when the model is compiled:
  a new batch shape makes torch.compile compile the model again (tens of seconds, and dynamic-shape
  kernels afterwards). With shuffling, a different remainder (under one global batch) is left out
  each epoch. Evaluation keeps every sample.
- `_save_checkpoint` writes into a staging folder and publishes the checkpoint with one rename
  once every rank has finished (finetune/checkpoint.py), so a checkpoint is complete or absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from transformers.utils import logging

from finetune.callbacks import MemoryCallback, ThroughputCallback
from finetune.checkpoint import STAGING_DIR, publish, write_manifest

logger = logging.get_logger("finetune")


class FinetuneTrainer(Trainer):
    def get_train_dataloader(self) -> Any:
        drop_last = self.args.dataloader_drop_last
        self.args.dataloader_drop_last = drop_last or self.args.torch_compile
        try:
            return super().get_train_dataloader()
        finally:
            self.args.dataloader_drop_last = drop_last

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if logs.get("grad_norm") == 0 and self.args.process_index == 0:
            logger.warning(
                f"finetune: gradient norm 0 at step {self.state.global_step}: the loss is not reaching the "
                "weights (every label masked, or a loss or compile path that loses the gradients)"
            )
        if "loss" in logs:
            for callback in self.callback_handler.callbacks:
                if isinstance(callback, (MemoryCallback, ThroughputCallback)):
                    logs.update(callback.log_scalars())
        super().log(logs, start_time)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        output_dir = self.args.output_dir
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged = Path(output_dir) / STAGING_DIR / name
        self.args.output_dir = str(staged.parent)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = output_dir
        if self.args.should_save and not (staged / "config.json").exists():
            self.model.config.save_pretrained(staged)  # FSDP's sharded save writes weights only
            if self.processing_class is not None:
                self.processing_class.save_pretrained(staged)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            write_manifest(staged, self.state.global_step, self.args.run_name)
            publish(staged, Path(output_dir) / name)
            if not any(staged.parent.iterdir()):
                staged.parent.rmdir()
        if self.state.best_model_checkpoint == str(staged):
            self.state.best_model_checkpoint = str(Path(output_dir) / name)
        if self.args.should_save:
            rotate_checkpoints(
                output_dir=output_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
            )
        self.accelerator.wait_for_everyone()
