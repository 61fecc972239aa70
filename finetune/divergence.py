"""Stop a run that diverged, at the step it did, before it writes a model or checkpoint from it.

A diverged run otherwise finishes as "completed": the Trainer keeps stepping on NaN weights and saves
them, and a loss of 1e7 evaluates to perplexity inf. Two signs are checked, both the same on every
rank (so all ranks stop at the same step and no collective is left waiting):

- the gradient norm of every optimizer step is finite (the Trainer computes it at every step, reduced
  over the ranks; a NaN or inf loss gives a non-finite norm). Steps the loss scaler skipped on overflow
  (fp16) are not divergence. The norm stays on the GPU: the first step with a non-finite norm is kept
  there and read only before a step's log, evaluation or save (reading it at every step made the host
  wait for each step's GPU work before it could queue the next; see docs/speed.md).
- the weights are finite before a checkpoint or the model is saved: an update from a finite but huge
  gradient step can overflow them before any gradient norm shows it.
- each logged loss (the mean over the ranks and the steps since the last log) stays below
  `loss_spike_factor` times the median of the earlier logged losses, or below the loss of a uniform
  guess over the vocabulary (ln V), which a training model never needs to exceed. A checkpoint's save
  checks the steps since the last log the same way (a save between logs otherwise kept diverged
  weights that a `--resume` then trained on), and each checkpoint keeps the recent logged losses, so
  that a resumed run is held to the same history.

No library offers this check (the Trainer's `logging_nan_inf_filter` hides such losses instead).
"""

from __future__ import annotations

import math
import statistics

import torch
import torch.distributed as dist

from finetune.errors import Diverged

RECENT_LOSSES = 20
DEFAULT_LOSS_SPIKE_FACTOR = 10.0


class DivergenceGuard:
    def __init__(self, loss_spike_factor: float, vocab_size: int | None) -> None:
        self.loss_spike_factor = loss_spike_factor
        self.uniform_guess_loss = math.log(vocab_size) if vocab_size else 0.0
        self.logged_losses: list[float] = []
        self._first_bad: torch.Tensor | None = None  # [step, norm] of the first non-finite norm, or [-1, 0]

    def check_gradient_norm(self, step: int, grad_norm: float | None) -> None:
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise Diverged(f"diverged at step {step}: gradient norm {grad_norm}")

    def observe_gradient_norm(self, step: int, grad_norm: torch.Tensor | float | None) -> None:
        """Note a step's norm without reading it: a tensor is compared on its device."""
        if not isinstance(grad_norm, torch.Tensor):
            self.check_gradient_norm(step, grad_norm)
            return
        if hasattr(grad_norm, "full_tensor"):  # FSDP2's norm is a DTensor of partial sums
            grad_norm = grad_norm.full_tensor()
        norm = grad_norm.detach().reshape(()).float()
        if self._first_bad is None:
            self._first_bad = torch.tensor([-1.0, 0.0], device=norm.device)
        this_step = torch.stack([torch.full_like(norm, step), norm])
        newly_bad = (self._first_bad[0] < 0) & ~torch.isfinite(norm)
        self._first_bad = torch.where(newly_bad, this_step, self._first_bad)

    def check_observed(self) -> None:
        """Raise for the first non-finite norm noted so far (one read of the device)."""
        if self._first_bad is None:
            return
        step, norm = self._first_bad.tolist()
        if step >= 0:
            raise Diverged(f"diverged at step {int(step)}: gradient norm {norm}")

    def check_logged_loss(self, step: int, loss: float) -> None:
        self.check_loss(step, loss)
        self.logged_losses.append(loss)

    def check_loss(self, step: int, loss: float) -> None:
        """The spike rule against the recent logged losses, without adding this one to them: a
        checkpoint's save checks the mean loss of the steps since the last log so."""
        if not math.isfinite(loss):
            raise Diverged(f"diverged at step {step}: loss {loss}")
        recent = self.recent_losses()
        if self.loss_spike_factor and recent:
            median = statistics.median(recent)
            if loss > self.loss_spike_factor * median and loss > self.uniform_guess_loss:
                raise Diverged(
                    f"diverged at step {step}: loss {loss:.4g} is over {self.loss_spike_factor:g}x the "
                    f"recent median {median:.4g} and over a uniform guess's {self.uniform_guess_loss:.4g}"
                )

    def recent_losses(self) -> list[float]:
        """What a checkpoint keeps, so that a resumed run checks its losses against the same history."""
        return self.logged_losses[-RECENT_LOSSES:]


def local_values(parameter: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter: FSDP2's local shard, DeepSpeed ZeRO-3's partition, else all of it."""
    if hasattr(parameter, "ds_tensor"):
        return parameter.ds_tensor
    if hasattr(parameter, "to_local"):
        return parameter.to_local()
    return parameter


def check_weights_finite(model: torch.nn.Module, step: int, what: str) -> None:
    """Raise Diverged on every rank if any rank holds a non-finite weight. Collective under several ranks."""
    parameters = model.named_parameters()
    bad = next((name for name, parameter in parameters if not local_values(parameter).isfinite().all()), None)
    flag = torch.tensor([bad is not None], dtype=torch.int32, device=next(model.parameters()).device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        where = f"weight {bad}" if bad else "a weight on another rank"
        raise Diverged(f"diverged at step {step}: {where} is not finite; {what} not written")
