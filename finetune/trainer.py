"""The project's Trainer: transformers.Trainer with documented-style overrides.

- `log` adds the measuring callbacks' scalars to the training logs, so every `report_to`
  integration and `state.log_history` receive them (a callback's `on_log` cannot: the integrations
  come first in the Trainer's callback list, and log_history is written before any callback runs).
- The console shows one compact line per log (finetune.console.ConsoleLines) in place of the
  Trainer's printer or progress bar, which print the dict of every logged value at every log.
- `log` also warns when a logged gradient norm is exactly 0: such a run updates nothing (all labels
  masked, or a loss or compile path that lost the gradients), however fast it looks.
- `get_train_dataloader` drops the last, smaller batch of each epoch when the model is compiled:
  a new batch shape makes torch.compile compile the model again (tens of seconds, and dynamic-shape
  kernels afterwards). With shuffling, a different remainder (under one global batch) is left out
  each epoch. Evaluation keeps every sample.
- `_save_checkpoint` pauses the run's watchdog (finetune/watchdog.py) and writes into a staging
  folder and publishes the checkpoint with one rename once every rank has finished
  (finetune/checkpoint.py), so a checkpoint is complete or absent. Its manifest records the run's
  identity (finetune/resume.py), which a resume must match.
- `train_loss` covers every step of a resumed run. The Trainer sums the logged losses in
  `_total_loss_scalar`, which starts at 0 in every `train()` and is not in its checkpoints, then
  divides by all steps, those before the resume included (a resumed run reported 7.37 where the
  uninterrupted one, with identical weights, reported 10.60). Each checkpoint's trainer_state.json
  now holds the sum so far (`LossSumSoFar`, a stateful callback, the Trainer's own mechanism for
  state it does not know), a resumed run starts its sum from there, and the end of training divides
  it by every step (`log`: the Trainer's own divisor differs between the versions setup.cfg allows).
- `_maybe_log_save_evaluate` and `log` stop a diverged run (finetune/divergence.py) before any log,
  evaluation or checkpoint from diverged weights: a non-finite gradient norm (kept on the GPU and read
  only at steps that log, evaluate, save or end, so that the host never waits for a step's GPU work
  in between; the error names the first such step), a logged loss spike, or, before a checkpoint, a
  weight that is not finite. `_clip_grad_norm` and `_get_grad_norm` leave DeepSpeed's norm a tensor
  for the same reason (accelerate and the Trainer read it with `.item()` at every step; the log
  converts it at logging steps).
- `_wrap_model` hands evaluation the model accelerate compiled (unless it records CUDA graphs), where
  the Trainer would evaluate the eager original (accelerate compiles a copy of the model; FSDP2 and
  DeepSpeed compile in place).
- `training_step` and `prediction_step` mark a new CUDA-graph step before each forward when the
  compile mode records CUDA graphs (reduce-overhead, as the single profile asks, or max-autotune):
  torch's graph trees cannot tell the Trainer's steps apart on their own, and a block-by-block
  compiled model otherwise fails at its first step reading outputs a later replay has overwritten.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, DynamoBackend, TorchDynamoPlugin
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_pt_utils import nested_gather
from transformers.trainer_utils import rotate_checkpoints
from transformers.utils import logging

from finetune.callbacks import MemoryCallback
from finetune.checkpoint import publish, remove_if_empty, write_manifest
from finetune.console import CONSOLE_CALLBACKS
from finetune.disk_space import expected_checkpoint_bytes, is_disk_full, report_disk_full, room_problem
from finetune.divergence import DEFAULT_LOSS_SPIKE_FACTOR, DivergenceGuard, check_weights_finite
from finetune.errors import FinetuneError
from finetune.fsdp_units import blocks_per_unit, prefetch_units
from finetune.launched import CompilePlan, Launch
from finetune.losses import next_tokens
from finetune.models import tied_parameter_names
from finetune.outputs import share_from_main
from finetune.resume import run_identity
from finetune.run_folder import STAGING_DIR, checkpoint_dir
from finetune.sequence_parallel import follow_epochs, skipping_split_batches
from finetune.slow_work import timeout_for_save
from finetune.throughput import ThroughputCallback
from finetune.watchdog import Watchdog

logger = logging.get_logger("finetune")


class LossSumSoFar(TrainerCallback, ExportableState):
    """The sum of the logged training losses up to a checkpoint, and the recent logged losses the
    divergence check compares with, saved in its trainer_state.json.

    The sum is None when unknown: the run was resumed from a checkpoint that did not record it.
    """

    def __init__(self, loss_sum: float | None = 0.0, recent_losses: list[float] | None = None) -> None:
        self.loss_sum = loss_sum
        self.recent_losses = recent_losses or []

    def state(self) -> dict[str, Any]:
        return {"args": {"loss_sum": self.loss_sum, "recent_losses": self.recent_losses}, "attributes": {}}


class FinetuneTrainer(Trainer):
    def __init__(
        self,
        *args: Any,
        run_flags: dict[str, Any] | None = None,
        launch: Launch | None = None,
        compile_plan: CompilePlan | None = None,
        data_source: str | None = None,
        **kwargs: Any,
    ) -> None:
        """`run_flags`: the flags that define the run (finetune.resume.defining_flags), and `data_source`,
        where its data was read from, for the manifest; `launch` and `compile_plan` as run.py resolved
        them (else read from the environment and flags)."""
        self.launch = launch or Launch.from_environment()
        training_args = kwargs["args"] if "args" in kwargs else args[1] if len(args) > 1 else None
        self.compile_plan = compile_plan or CompilePlan.of_arguments(training_args)
        super().__init__(*args, **kwargs)
        self.run_flags = run_flags or {}
        self.data_source = data_source
        self.add_callback(LossSumSoFar())
        for printer, console in CONSOLE_CALLBACKS.items():
            if self.pop_callback(printer) is not None:
                self.add_callback(console())
        self._loss_sum_before: float | None = 0.0
        self._loss_sum_to_restore = False
        vocab_size = getattr(getattr(self.model, "config", None), "vocab_size", None)
        # plain TrainingArguments (a Trainer built outside run.py) have no such flag: the default
        spike_factor = getattr(self.args, "loss_spike_factor", DEFAULT_LOSS_SPIKE_FACTOR)
        self.divergence = DivergenceGuard(spike_factor, vocab_size)

    def _maybe_log_save_evaluate(
        self, tr_loss: torch.Tensor, grad_norm: Any, *args: Any, **kwargs: Any
    ) -> None:
        """Every optimizer step ends here: its gradient norm is noted, and the norms noted so far are
        checked before anything is logged, evaluated or saved."""
        if grad_norm is not None and not self.accelerator.optimizer_step_was_skipped:
            self.divergence.observe_gradient_norm(self.state.global_step, grad_norm)
        control = self.control
        writes_or_ends = (
            control.should_log
            or control.should_evaluate
            or control.should_save
            or control.should_training_stop
        )
        if writes_or_ends:
            self.divergence.check_observed()
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    def _clip_grad_norm(self, model: Any) -> Any:
        """DeepSpeed clipped in its own step, inside the backward: only its norm is read here, as the
        tensor its engine computed (accelerate's reading calls `.item()`, a host sync every step)."""
        if self.accelerator.distributed_type != DistributedType.DEEPSPEED:
            return super()._clip_grad_norm(model)
        wrapped = self.accelerator.deepspeed_engine_wrapped
        return wrapped.engine.get_global_grad_norm() if wrapped is not None else None

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        """DeepSpeed's norm left a tensor (the Trainer reads it with `.item()` at every step)."""
        if self.accelerator.distributed_type != DistributedType.DEEPSPEED:
            return super()._get_grad_norm(model, grad_norm)
        return self._clip_grad_norm(model) if grad_norm is None else grad_norm

    def _init_training_state(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        """Once the state is restored, take the loss sum its checkpoint recorded."""
        trained = super()._init_training_state(*args, **kwargs)
        name = LossSumSoFar.__name__
        recorded = self.state.stateful_callbacks.setdefault(name, LossSumSoFar(loss_sum=None).state())
        arguments = recorded.get("args") if isinstance(recorded, dict) else None
        loss_sum = arguments.get("loss_sum") if isinstance(arguments, dict) else None  # unknown if missing
        if not isinstance(loss_sum, (int, float)) or isinstance(loss_sum, bool):
            loss_sum = None
        self._loss_sum_before = loss_sum if self.state.global_step else 0.0
        recent = arguments.get("recent_losses") if isinstance(arguments, dict) else None
        if self.state.global_step and isinstance(recent, list):
            self.divergence.logged_losses = [float(loss) for loss in recent if isinstance(loss, (int, float))]
        self._loss_sum_to_restore = True
        return trained

    def _run_epoch(self, **kwargs: Any) -> Any:
        """The loop has just set the sum to 0: the first epoch starts it from the checkpoint's, so the
        losses are added in the uninterrupted run's order and its train_loss is matched to the bit.
        A --sequence_parallel run's Ulysses data loader also follows the epoch number and skips a
        resumed epoch's trained batches (finetune/sequence_parallel.py)."""
        if self._loss_sum_to_restore:
            self._total_loss_scalar = self._loss_sum_before or 0.0
            self._loss_sum_to_restore = False
        if self.launch.sequence_split != "ulysses":
            return super()._run_epoch(**kwargs)
        follow_epochs(kwargs["train_dataloader"]).set_epoch(kwargs["epoch"])
        with skipping_split_batches():
            return super()._run_epoch(**kwargs)

    def _finalize_training(self, *args: Any, **kwargs: Any) -> Any:
        """The end of training's metrics pass through `log`, which sets their train_loss."""
        output = super()._finalize_training(*args, **kwargs)
        return output._replace(training_loss=output.metrics.get("train_loss"))

    def _train_loss_of_every_step(self, logs: dict[str, float]) -> None:
        """The end of training's train_loss: the sum over every step divided by every step, set here
        because the Trainer's divisor differs between the versions setup.cfg allows (every step, then
        only the steps of this `train()` call). Resumed from a checkpoint without a loss sum, there is
        none: the sum would hold only the steps since the resume."""
        if self._loss_sum_before is None:
            logs.pop("train_loss")
        else:
            logs["train_loss"] = self._total_loss_scalar / max(self.state.global_step, 0.001)

    def _prepare_for_training(self, *args: Any, **kwargs: Any) -> Any:
        """accelerate prepares the model here: FSDP2 units of --fsdp_blocks_per_unit blocks, then
        each prefetching --fsdp_prefetch units ahead."""
        with blocks_per_unit(self.model, getattr(self.args, "fsdp_blocks_per_unit", None) or 1):
            prepared = super()._prepare_for_training(*args, **kwargs)
        prefetch_units(self.model, getattr(self.args, "fsdp_prefetch", 0))
        return prepared

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """A resumed checkpoint lacks the tied weights it stores once (GPT-2's lm_head): no warning on
        every resume for those; any other missing key still warns."""
        tied = tied_parameter_names(self.model)
        missing = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        """accelerate compiles only what the compile plan gives it (not ZeRO-3's blocks, which
        run.py compiles itself), block by block where the plan says so (the plugin would read the
        launcher's variable, which a plain DeepSpeed launch leaves unset); DDP takes
        --ddp_gradient_as_bucket_view, which the Trainer's own DDP keyword arguments leave out."""
        args = super()._build_accelerator_args(**kwargs)
        if not self.compile_plan.by_accelerate:
            args["dynamo_plugin"] = TorchDynamoPlugin(backend=DynamoBackend.NO)
        elif "dynamo_plugin" in args:
            args["dynamo_plugin"].use_regional_compilation = self.compile_plan.scope == "per_block"
        for handler in args.get("kwargs_handlers", []):
            if isinstance(handler, DistributedDataParallelKwargs):
                handler.gradient_as_bucket_view = getattr(self.args, "ddp_gradient_as_bucket_view", False)
        return args

    def ddp_gradient_buckets(self) -> str | None:
        """How the wrapped DDP model keeps its gradients: "views" into its all-reduce buckets or
        "copies" beside them (4 bytes a trained parameter more); None without DDP. Read from the
        wrapper itself, so the summary says what DDP did, not what was asked."""
        wrapped = self.model_wrapped
        wrapped = getattr(wrapped, "_orig_mod", wrapped)  # under torch.compile's wrapper
        if not isinstance(wrapped, DistributedDataParallel):
            return None
        return "views" if wrapped.gradient_as_bucket_view else "copies"

    def records_cuda_graphs(self) -> bool:
        return self.compile_plan.records_cuda_graphs

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.records_cuda_graphs():
            torch.compiler.cudagraph_mark_step_begin()
        return super().training_step(*args, **kwargs)

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """DeepSpeed's Ulysses adapter hands each rank a slice along the sequence and copies it with
        `.cpu()`, a copy only from a GPU: on CPU ranks the slice of a batch of several rows stays a
        strided view, which the causal LM loss's `.view(-1)` refuses. Made contiguous here."""
        prepared = super()._prepare_inputs(inputs)
        if self.launch.sequence_split == "ulysses":
            prepared = {k: v.contiguous() if torch.is_tensor(v) else v for k, v in prepared.items()}
        return prepared

    def splits_by_ring(self) -> bool:
        """Whether training batches are cut over ring-attention groups (torch context parallelism)."""
        parallelism = getattr(self.accelerator, "parallelism_config", None)
        return parallelism is not None and parallelism.cp_enabled and parallelism.cp_backend == "torch"

    def _prepare_context_parallel_inputs(
        self, model: Any, inputs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """Under ring attention a training batch is cut into the group's chunks; an evaluation batch
        runs whole on its rank: the per-sample loss sums of evaluation
        (`evaluation.loss_sums_per_sample`) shift each sample's labels by one inside the sample, which
        the chunks would cut apart. A training batch's labels are shifted here, before the cut, as
        transformers does where they are missing, with a warning from every rank."""
        if not model.training:
            return contextlib.nullcontext, inputs
        if self.splits_by_ring() and "labels" in inputs and "shift_labels" not in inputs:
            # contiguous: the ring slices the shifted labels along the sequence
            inputs = {**inputs, "shift_labels": next_tokens(inputs["labels"]).contiguous()}
        return super()._prepare_context_parallel_inputs(model, inputs)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """Under ring attention, evaluation batches are dealt over every rank, not over the
        data-parallel groups as accelerate deals the training batches: they run whole on each rank,
        so no group evaluates the same batch N times over, and `gather_for_metrics`, which gathers
        from every rank, trims the last batch's padding by a remainder counted over those same
        ranks (counted over the groups, it would keep one group's samples twice and drop another's)."""
        if not self.splits_by_ring():
            return super().get_eval_dataloader(eval_dataset)
        self.accelerator._prepare_device_mesh = lambda: None  # accelerate then deals over every rank
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            del self.accelerator._prepare_device_mesh

    def _wrap_model(self, model: Any, training: bool = True, dataloader: Any = None) -> Any:
        """Evaluation runs the model accelerate compiled, unless it records CUDA graphs. accelerate
        compiles a copy of the model (its blocks compiled, or the whole wrapped by torch.compile) and
        the Trainer evaluates `self.model`, the eager original, wherever the model is not compiled in
        place (FSDP2's and DeepSpeed's are): eager, autocast keeps a bf16 copy of every weight it casts
        until the forward ends and GPT-2's activation its fp32 intermediates, and each evaluation runs
        at eager speed. Graphs recorded for evaluation's batches held more than that eager forward
        (docs/planner.md, "The final evaluation"): under them evaluation stays eager."""
        if not training and model is self.model:
            compiled = self.compiled_copy()
            if compiled is not None:
                return compiled
        return super()._wrap_model(model, training, dataloader)

    def compiled_copy(self) -> Any:
        """The copy of the model accelerate compiled, without DDP (an evaluation reduces no
        gradients), where evaluation runs it; None where it runs `self.model`."""
        plan = self.compile_plan
        if self.launch.strategy.compiles_in_place or not plan.by_accelerate or plan.records_cuda_graphs:
            return None
        compiled = self.model_wrapped
        while isinstance(compiled, DistributedDataParallel):
            compiled = compiled.module
        # a whole-model compile of DDP's wrapper holds DDP inside: the eager original then
        if compiled is self.model or isinstance(
            getattr(compiled, "_orig_mod", None), DistributedDataParallel
        ):
            return None
        return compiled

    def evaluates_compiled(self) -> bool:
        """Whether evaluation runs compiled code: a model compiled in place, or accelerate's copy."""
        if self.launch.strategy.compiles_in_place:
            return self.compile_plan.compiled
        return self.compiled_copy() is not None

    def prediction_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.records_cuda_graphs():
            torch.compiler.cudagraph_mark_step_begin()
        return super().prediction_step(*args, **kwargs)

    def get_train_dataloader(self) -> Any:
        drop_last = self.args.dataloader_drop_last
        self.args.dataloader_drop_last = drop_last or self.compile_plan.compiled
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
        if "train_loss" in logs:  # in place: the Trainer returns this dict as the training's metrics
            self._train_loss_of_every_step(logs)
        super().log(logs, start_time)
        if "loss" in logs:  # logged first, so the loss curve shows the value that stopped the run
            self.divergence.check_logged_loss(self.state.global_step, logs["loss"])

    def _unlogged_loss(self) -> float:
        """The sum of the step losses since the last log, averaged over ranks as a log would.

        Collective: every rank saves.
        """
        return nested_gather(self._tr_loss, self.args.parallel_mode).mean().item()

    def check_unlogged_loss(self, unlogged: float) -> None:
        """Before a save, the mean loss of the steps since the last log meets the spike rule, as a log
        would check it."""
        steps = self.state.global_step - self._globalstep_last_logged
        if steps > 0:
            self.divergence.check_loss(self.state.global_step, unlogged / steps)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        watchdogs = [
            callback for callback in self.callback_handler.callbacks if isinstance(callback, Watchdog)
        ]
        size = expected_checkpoint_bytes(Path(self.args.output_dir), self.model)
        with contextlib.ExitStack() as paused:
            for watchdog in watchdogs:
                paused.enter_context(watchdog.paused())
            paused.enter_context(timeout_for_save(size, self.args.ddp_timeout))
            self._save_checkpoint_staged(model, trial)

    def _save_checkpoint_staged(self, model: Any, trial: Any) -> None:
        check_weights_finite(self.model, self.state.global_step, "this checkpoint")
        room = room_problem(Path(self.args.output_dir), self.model, self.state.global_step)
        verdict = share_from_main(room if self.args.should_save else None)  # every rank stops, or none
        if verdict is not None:
            raise FinetuneError(verdict)
        unlogged = self._unlogged_loss()  # one gather for the check and the loss sum
        self.check_unlogged_loss(unlogged)
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, LossSumSoFar):
                callback.loss_sum = (
                    None if self._loss_sum_before is None else self._total_loss_scalar + unlogged
                )
                callback.recent_losses = self.divergence.recent_losses()
        output_dir = self.args.output_dir
        name = checkpoint_dir(output_dir, self.state.global_step).name
        staged = Path(output_dir) / STAGING_DIR / name
        self.args.output_dir = str(staged.parent)
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:  # torch.save's RuntimeError, safetensors' SafetensorError, OSError
            if is_disk_full(error, Path(output_dir)):
                raise report_disk_full(error, staged, Path(output_dir)) from None
            raise
        finally:
            self.args.output_dir = output_dir
        if self.args.should_save and not (staged / "config.json").exists():
            self.model.config.save_pretrained(staged)  # FSDP's sharded save writes weights only
            if self.processing_class is not None:
                self.processing_class.save_pretrained(staged)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            identity = run_identity(self.run_flags, self.launch, self.args, self.data_source)
            step, model_only = self.state.global_step, self.args.save_only_model
            write_manifest(staged, step, self.args.run_name, identity, model_only)
            publish(staged, Path(output_dir) / name)
            remove_if_empty(staged.parent)
        if self.state.best_model_checkpoint == str(staged):
            self.state.best_model_checkpoint = str(Path(output_dir) / name)
        if self.args.should_save:
            rotate_checkpoints(
                output_dir=output_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
            )
        self.accelerator.wait_for_everyone()
