"""What a person sees while a run trains: one compact line per log (loss, rate, MFU, memory, ETA) in
place of transformers' dict of every logged value, printed by the run's first rank only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback


def compact_number(value: float) -> str:
    """12345 -> 12.3k: a rate read at a glance."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"


def duration(seconds: float) -> str:
    """3m12s, 1h02m, 45s."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def training_line(logs: dict[str, Any], step: int, max_steps: int, eta_s: float | None) -> str:
    """`step 40/200 | loss 6.112 | lr 9.5e-04 | ...`: what a person follows a run by.

    A field whose measurement is missing from `logs` (MFU without a known peak, GPU memory on CPU,
    throughput before its warm-up steps are over) is left out rather than shown empty.
    """
    fields = [f"step {step}/{max_steps}", f"loss {logs['loss']:.4g}"]
    if "learning_rate" in logs:
        fields.append(f"lr {logs['learning_rate']:.1e}")
    if logs.get("grad_norm") is not None:
        fields.append(f"grad {logs['grad_norm']:.3g}")
    if "throughput/tokens_per_second_per_device" in logs:
        fields.append(f"{compact_number(logs['throughput/tokens_per_second_per_device'])} tok/s/dev")
    if "throughput/mfu" in logs:
        fields.append(f"MFU {100 * logs['throughput/mfu']:.1f}%")
    if "memory/peak_allocated_gib_max" in logs:
        fields.append(f"peak {logs['memory/peak_allocated_gib_max']:.1f} GiB")
    elif "memory/host_peak_rss_gib_max" in logs:
        fields.append(f"host peak {logs['memory/host_peak_rss_gib_max']:.1f} GiB")
    if eta_s is not None:
        fields.append(f"ETA {duration(eta_s)}")
    return " | ".join(fields)


def evaluation_line(logs: dict[str, Any], step: int) -> str | None:
    """`eval at step 200 | loss 5.93 | perplexity 376.1` for an evaluation's log; None for other logs.

    An evaluation's keys share its prefix (`eval_`, `test_`) and always include `<prefix>_runtime`;
    the loss shown is the token-weighted one where the run computed it (finetune.evaluation).
    """
    for key in logs:
        prefix = key.removesuffix("_runtime")
        if prefix == key or prefix == "train":
            continue
        loss = logs.get(f"{prefix}_token_loss", logs.get(f"{prefix}_loss"))
        fields = [f"{prefix} at step {step}"]
        if loss is not None:
            fields.append(f"loss {loss:.4g}")
        if f"{prefix}_perplexity" in logs:
            fields.append(f"perplexity {logs[f'{prefix}_perplexity']:.4g}")
        return " | ".join(fields)
    return None


class ConsoleLines:
    """The lines for the Trainer's logs: training logs and evaluations; other logs (the end-of-training
    totals, the run's `run/` scalars) are in the run's closing report and print nothing here.

    The ETA extrapolates the wall time per step between the first training log and the latest one,
    so it leaves out set-up and the first step's compilation; it is unknown until the second log.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._first: tuple[float, int] | None = None

    def line(self, state: TrainerState, logs: dict[str, Any]) -> str | None:
        if "loss" not in logs:
            return evaluation_line(logs, state.global_step)
        now, step = self.clock(), state.global_step
        if self._first is None:
            self._first = (now, step)
        first_time, first_step = self._first
        eta = None
        if step > first_step:
            eta = (now - first_time) / (step - first_step) * max(state.max_steps - step, 0)
        return training_line(logs, step, state.max_steps, eta)


class CompactLogLines:
    """Prints one compact line per log on the run's first rank, through the subclass's `write`."""

    lines: ConsoleLines

    def write(self, line: str) -> None:
        raise NotImplementedError

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if state.is_world_process_zero and (line := self.lines.line(state, logs or {})):
            self.write(line)


class ConsoleProgressCallback(CompactLogLines, ProgressCallback):
    """transformers' progress bars, with one compact line per log printed above them instead of a dict
    of every logged value (those stay in `state.log_history`, TensorBoard and run_summary.json)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.lines = ConsoleLines(clock)

    def write(self, line: str) -> None:
        tqdm.write(line)


class ConsolePrinterCallback(CompactLogLines, PrinterCallback):
    """With `--disable_tqdm true`: the compact lines alone, printed by the first rank of the run only
    (transformers' printer prints the whole dict on the first rank of every machine)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.lines = ConsoleLines(clock)

    def write(self, line: str) -> None:
        print(line, flush=True)


CONSOLE_CALLBACKS: dict[type[TrainerCallback], type[TrainerCallback]] = {
    ProgressCallback: ConsoleProgressCallback,
    PrinterCallback: ConsolePrinterCallback,
}
