"""run_summary.json: one flat record per run, written by rank 0 however the run ends.

FIELDS is the record's documentation and its schema: every field is always present, null when it
does not apply or was not known when the run ended (CUDA memory on a CPU run, throughput of a run
that failed before its first step, the model size of a run whose model did not load).
`python -m finetune.summary` prints FIELDS as the table of docs/measurements.md.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from finetune.adapters import trainable_parameters
from finetune.arguments import as_record
from finetune.callbacks import MemoryCallback, ThroughputCallback
from finetune.checkpoint import checkpoints_newest_first, read_manifest
from finetune.data import DataSummary
from finetune.errors import Diverged, StoppedForResume, first_line, reported_by_another_rank
from finetune.flops import PeakFlops, matmul_parameters, tf32_matmuls, training_dtype
from finetune.launched import BatchGeometry, Launch
from finetune.models import count_parameters
from finetune.run_folder import DOCTOR_REPORT, SUMMARY_FILE

PACKAGES = ("torch", "transformers", "accelerate", "deepspeed", "datasets")

# name: (type, meaning). A type ending in "?" may be null.
FIELDS: dict[str, tuple[str, str]] = {
    "status": (
        "str",
        (
            "completed, failed, diverged (a non-finite gradient norm, weight or a loss spike stopped it; "
            "nothing saved from it) or interrupted (stopped by a signal, with or without a checkpoint)"
        ),
    ),
    "error": ("str?", "why the run did not complete, in one line"),
    "run_name": ("str", "TensorBoard run name; logs in output_dir/runs/run_name"),
    "output_dir": ("str", "where the model, logs and this file are"),
    "started_at": ("str", "start time, ISO 8601, UTC"),
    "wall_time_s": (
        "float",
        "seconds from rank 0's process start to this record: start-up (imports included), training, "
        "evaluation, saving",
    ),
    "profile": ("str?", "profile name given to `finetune run` (null under a bare `accelerate launch`)"),
    "strategy": (
        "str?",
        "what ran, named as the shipped profiles are whatever the profile file was called: single, ddp, "
        "fsdp, fsdp_grad_op, zero1/2/3, zero2_offload, zero3_offload, zero3_nvme",
    ),
    "distributed_type": ("str?", "accelerate's distributed type (MULTI_GPU, FSDP, DEEPSPEED, ...)"),
    "world_size": ("int?", "processes (one per GPU)"),
    "data_parallel_size": (
        "int?",
        "processes that each take a share of every global batch: all of them (no tensor or sequence "
        "parallel dimension)",
    ),
    "num_hosts": ("int?", "machines the ranks ran on"),
    "zero_stage": ("int?", "DeepSpeed ZeRO stage"),
    "dtype": ("str?", "compute dtype of the matrix multiplies: bf16, fp16, tf32 or fp32"),
    "model": ("str?", "--model as given"),
    "model_location": ("str?", "the folder or Hub name it resolved to"),
    "from_scratch": ("bool?", "random weights from the config instead of loaded weights"),
    "peft": (
        "str?",
        "lora or dora: adapters trained on a frozen base, and checkpoints and the saved model hold only "
        "the adapters (docs/lora.md); null: every weight trained",
    ),
    "parameters": ("int?", "unique parameters (tied embeddings once), adapters included"),
    "trainable_parameters": ("int?", "parameters the optimizer updates (with --peft: the adapters only)"),
    "matmul_parameters": (
        "int?",
        "N of 6·N: parameters in matrix multiplies (no embedding lookups; tied LM head once)",
    ),
    "num_layers": ("int?", "transformer blocks, L"),
    "hidden_size": ("int?", "model width, H"),
    "flops_per_token": (
        "int?",
        "model FLOPs per trained token, 6·N + 12·L·H·T with T = block_size (a frozen weight counts 4, not 6)",
    ),
    "gradient_checkpointing": ("bool?", "activations recomputed in backward (not in flops_per_token)"),
    "fp8_layers": (
        "int?",
        "--fp8: layers multiplying in float8 (torchao); MFU still counts against the bf16 peak. "
        "None without --fp8",
    ),
    "zero3_leaf_modules": (
        "list?",
        "ZeRO-3 full fine-tuning: the block classes gathered and reduced as one DeepSpeed leaf module "
        "each (the model's _no_split_modules, unless the DeepSpeed JSON names its own leaf_module); "
        "None otherwise",
    ),
    "zero3_compiled_blocks": (
        "int?",
        "ZeRO-3 compiled: leaf blocks whose forward torch.compile compiled, DeepSpeed's hooks around "
        "them left eager; None otherwise",
    ),
    "fsdp_units": (
        "int?",
        "FSDP profiles: the FSDP2 units the transformer blocks were sharded into (the blocks divided by "
        "--fsdp_blocks_per_unit, rounded up); None otherwise",
    ),
    "torch_compile": (
        "bool?",
        "model compiled by torch.compile (default with CUDA but offload; ZeRO-3: its leaf blocks)",
    ),
    "torch_compile_regional": (
        "bool?",
        "compiled block by block (accelerate's regional compilation, as the FSDP profiles ask), "
        "not as one graph",
    ),
    "torch_compile_mode": (
        "str?",
        "torch.compile's mode when compiled: reduce-overhead (CUDA graphs, as the single profile asks) "
        "or default",
    ),
    "loss_compiled": (
        "bool?",
        "the loss compiled on its own, as where the model is compiled block by block (--compile_loss)",
    ),
    "dataset": ("str?", "--dataset as given"),
    "data_source": ("str?", "the folder or Hub id it was read from"),
    "block_size": ("int?", "tokens per sample, T"),
    "packing": ("bool?", "texts concatenated into full blocks (else padded per text)"),
    "train_samples": ("int?", "training samples (blocks) available"),
    "eval_samples": ("int?", "evaluation samples"),
    "train_tokens": ("int?", "predicted tokens in the training set (instruction data: answer tokens)"),
    "data_format": (
        "str?",
        "text, prompt_completion, instruction, question_answer or messages (docs/instruction-data.md)",
    ),
    "masked_tokens": ("int?", "instruction data: prompt tokens in the training set, not trained on"),
    "truncated_examples": ("int?", "instruction data: training examples longer than block_size, cut to it"),
    "packing_efficiency": (
        "float?",
        "real tokens / computed tokens of the training samples (null: padded per batch at run time)",
    ),
    "data_notes": ("list", "the data format and what was done to the data (missing split, truncation)"),
    "micro_batch_size": ("int?", "samples per device per forward"),
    "gradient_accumulation_steps": ("int?", "forwards per optimizer step"),
    "global_batch_size": ("int?", "samples per optimizer step over all ranks"),
    "batch_choice": (
        "str?",
        "with --global_batch_size: why micro_batch_size and gradient_accumulation_steps are what they are "
        "(the planner's largest fitting micro batch, or the batch flags given); null without it",
    ),
    "learning_rate": ("float?", "peak learning rate"),
    "seed": ("int?", "random seed"),
    "device_name": ("str?", "GPU model (torch.cuda.get_device_name) or cpu"),
    "device_count": ("int?", "GPUs visible on rank 0's host (CPUs on a CPU run)"),
    "python_version": ("str?", "Python"),
    "torch_version": ("str?", "PyTorch"),
    "cuda_version": ("str?", "CUDA PyTorch was built with"),
    "transformers_version": ("str?", "transformers"),
    "accelerate_version": ("str?", "accelerate"),
    "deepspeed_version": ("str?", "DeepSpeed"),
    "datasets_version": ("str?", "datasets"),
    "resumed_from": ("str?", "the checkpoint this run continued from"),
    "resumed_from_step": ("int?", "the step of that checkpoint"),
    "doctor": (
        "str?",
        "what `finetune doctor` (or `finetune run --doctor`) found in this output_dir: passed, or the "
        "checks that failed (output_dir/doctor.json has the table)",
    ),
    "hang": ("str?", "the folder of every rank's stack when the watchdog ended a run that stopped stepping"),
    "embeddings_resized_to": (
        "int?",
        "rows of the embedding (and output layer) after growing them for the tokenizer's added tokens",
    ),
    "max_steps_extended_from": (
        "int?",
        "--resume with a larger --max_steps: the checkpoint's run's; the learning-rate schedule was "
        "planned anew for the larger one and continued from the checkpoint's step",
    ),
    "checkpoint": ("str?", "the last checkpoint this run saved"),
    "steps": ("int?", "optimizer steps taken (counting those before a resume)"),
    "train_loss": ("float?", "Trainer's mean training loss over all steps"),
    "final_loss": ("float?", "last logged training loss"),
    "train_runtime_s": ("float?", "Trainer's train_runtime: the whole train() call"),
    "time_to_first_step_s": (
        "float?",
        "seconds from rank 0's process start to the end of its first optimizer step: imports, data, "
        "model, wrapping, compilation and that step (GPU figures: benchmarks/)",
    ),
    "startup_phases_s": (
        "dict?",
        "time_to_first_step_s by phase, in order: imports (and arguments), data, model, wrapping (the "
        "Trainer and accelerate's prepare), first step (compilation in it)",
    ),
    "throughput_warmup_steps": ("int?", "first steps left out of the throughput"),
    "throughput_steps": ("int?", "steps the throughput is measured over (no warm-up, evaluation or saving)"),
    "samples_per_second": ("float?", "training samples per second, all ranks"),
    "samples_per_second_per_device": ("float?", "samples_per_second / world_size"),
    "tokens_per_second": (
        "float?",
        "real (non-padding) input tokens per second, all ranks; packed examples count all their tokens",
    ),
    "tokens_per_second_per_device": ("float?", "tokens_per_second / world_size"),
    "trained_tokens_per_second": (
        "float?",
        "tokens the loss is on per second, all ranks (instruction data: answer tokens)",
    ),
    "step_time_median_s": ("float?", "median optimizer-step time on rank 0"),
    "step_time_p90_s": ("float?", "90th percentile optimizer-step time on rank 0"),
    "peak_tflops": ("float?", "peak dense TFLOP/s per device in dtype (null: unknown device)"),
    "peak_tflops_source": ("str?", "where peak_tflops comes from (datasheet row or --peak_tflops)"),
    "achieved_tflops_per_device": ("float?", "flops_per_token x tokens_per_second_per_device / 1e12"),
    "mfu": ("float?", "model FLOPs utilisation: achieved / peak, a fraction (null: peak unknown)"),
    "memory_device": (
        "str?",
        "cuda: the memory_* allocator fields are GPU memory; cpu: only host RSS applies",
    ),
    "memory_setup_peak_allocated_gib_max": (
        "float?",
        "GPU peak before training (model, wrapping, optimizer), max over ranks",
    ),
    "memory_peak_allocated_gib_max": ("float?", "GPU training peak of allocated tensors, max over ranks"),
    "memory_peak_allocated_gib_mean": ("float?", "the same, mean over ranks"),
    "memory_peak_allocated_rank": ("int?", "the rank with the highest training peak"),
    "memory_peak_reserved_gib_max": (
        "float?",
        "GPU training peak reserved by the caching allocator, max over ranks",
    ),
    "memory_peak_reserved_gib_mean": ("float?", "the same, mean over ranks"),
    "memory_peak_reserved_rank": ("int?", "the rank with the highest reserved peak"),
    "memory_allocated_gib_max": ("float?", "GPU memory allocated at the end of training, max over ranks"),
    "memory_reserved_gib_max": ("float?", "GPU memory reserved at the end of training, max over ranks"),
    "memory_host_peak_rss_gib_max": (
        "float?",
        "host RSS peak of a rank's process since it started, max over ranks",
    ),
    "memory_host_peak_rss_gib_mean": ("float?", "the same, mean over ranks"),
    "memory_host_peak_rss_rank": ("int?", "the rank with the highest host RSS peak"),
    "memory_host_rss_gib_max": ("float?", "host RSS at the end of training, max over ranks"),
    "eval_loss": ("float?", "validation loss: mean over all validation tokens of all ranks"),
    "eval_perplexity": ("float?", "exp(eval_loss)"),
    "eval_tokens": ("int?", "validation tokens predicted"),
    "test_loss": ("float?", "the same on the test split (--eval_test_split)"),
    "test_perplexity": ("float?", "exp(test_loss)"),
    "test_tokens": ("int?", "test tokens predicted"),
    "generations": ("list", "[{prompt, completion}] for --generation_prompt, from the saved model"),
    "loss_curve": ("list", "[{step, loss}] at every logging step"),
    "ranks": ("list", "per rank: rank, host, steps, and its memory readings at the end of training"),
    "arguments": ("dict", "every argument of the run, as parsed"),
}
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


def validate_summary(record: dict[str, Any]) -> list[str]:
    """What is wrong with a record against FIELDS: missing or unknown fields, wrong types."""
    problems = [f"missing field {name}" for name in FIELDS if name not in record]
    problems += [f"undocumented field {name}" for name in record if name not in FIELDS]
    for name, (kind, _) in FIELDS.items():
        value = record.get(name)
        if name not in record or (value is None and kind.endswith("?")):
            continue
        allowed = JSON_TYPES[kind.rstrip("?")]
        wrong_bool = isinstance(value, bool) and bool not in allowed
        if not isinstance(value, allowed) or wrong_bool:
            problems.append(f"{name} is {type(value).__name__}, documented as {kind}")
    return problems


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {
        "python_version": platform.python_version(),
        "cuda_version": torch.version.cuda,
    }
    for package in PACKAGES:
        try:
            found[f"{package}_version"] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[f"{package}_version"] = None
    return found


def hardware() -> dict[str, Any]:
    if torch.cuda.is_available():
        return {"device_name": torch.cuda.get_device_name(), "device_count": torch.cuda.device_count()}
    return {"device_name": "cpu", "device_count": os.cpu_count()}


def loss_curve(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [{"step": entry["step"], "loss": entry["loss"]} for entry in log_history if "loss" in entry]


# The record's fields, group by group, as the run learns them.


def configuration_fields(
    model_args: Any, data_args: Any, training_args: Any, launch: Launch
) -> dict[str, Any]:
    """What the run was asked to do, and on what: known before anything is loaded."""
    geometry = BatchGeometry.of(training_args, launch.data_parallel_size)
    return {
        "profile": launch.profile,
        "model": model_args.model,
        "from_scratch": model_args.from_scratch,
        "peft": model_args.peft,
        "dataset": data_args.dataset,
        "packing": data_args.packing,
        "gradient_checkpointing": training_args.gradient_checkpointing,
        "micro_batch_size": geometry.micro,
        "gradient_accumulation_steps": geometry.accumulation,
        "global_batch_size": geometry.global_batch,
        "batch_choice": training_args.batch_choice,
        "learning_rate": training_args.learning_rate,
        "seed": training_args.seed,
        "dtype": training_dtype(training_args.bf16, training_args.fp16, tf32_matmuls()),
        "arguments": as_record(model_args, data_args, training_args),
        **hardware(),
        **versions(),
    }


def data_fields(location: str, block_size: int, data: DataSummary) -> dict[str, Any]:
    return {
        "model_location": location,
        "data_source": data.source,
        "block_size": block_size,
        "train_samples": data.train_samples,
        "eval_samples": data.eval_samples,
        "train_tokens": data.train_tokens,
        "data_format": data.data_format,
        "masked_tokens": data.masked_tokens,
        "truncated_examples": data.truncated_examples,
        "packing_efficiency": data.packing_efficiency,
        "data_notes": data.notes,
    }


def model_fields(model: Any, config: Any, token_flops: int, peak: PeakFlops | None) -> dict[str, Any]:
    return {
        "parameters": count_parameters(model),
        "trainable_parameters": trainable_parameters(model),
        "matmul_parameters": matmul_parameters(model),
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "flops_per_token": token_flops,
        "peak_tflops": peak.tflops if peak else None,
        "peak_tflops_source": peak.source if peak else None,
    }


def doctor_fields(output_dir: Path) -> dict[str, Any]:
    """ "passed", or the checks that failed, as `finetune run --doctor` left them in doctor.json."""
    try:
        rows = json.loads((output_dir / DOCTOR_REPORT).read_text())
    except (OSError, ValueError):
        return {"doctor": None}
    failed = sorted({row["name"] for row in rows if not row.get("passed")})
    return {"doctor": "passed" if not failed else "failed: " + ", ".join(failed)}


def resume_fields(checkpoint: Path | None) -> dict[str, Any]:
    if checkpoint is None:
        return {"resumed_from": None, "resumed_from_step": None}
    return {"resumed_from": str(checkpoint), "resumed_from_step": read_manifest(checkpoint)["step"]}


def training_fields(
    state: Any,
    output_dir: str,
    train_metrics: dict[str, Any],
    memory: MemoryCallback,
    throughput: ThroughputCallback,
) -> dict[str, Any]:
    """What training did: steps, losses, checkpoint, and the callbacks' run-wide measurements."""
    curve = loss_curve(state.log_history)
    checkpoints = checkpoints_newest_first(output_dir)
    return {
        "steps": state.global_step,
        "checkpoint": str(checkpoints[0]) if checkpoints else None,
        "train_loss": train_metrics.get("train_loss"),
        "train_runtime_s": train_metrics.get("train_runtime"),
        "loss_curve": curve,
        "final_loss": curve[-1]["loss"] if curve else None,
        **memory.summary(),
        **throughput.summary(),
        "num_hosts": len({rank["host"] for rank in throughput.ranks}) or None,
        "ranks": [
            {**progress, **readings}
            for progress, readings in zip(throughput.ranks, memory.per_rank(), strict=True)
        ],
    }


def evaluation_fields(metrics: dict[str, float], prefix: str) -> dict[str, Any]:
    """The token-weighted loss (finetune/evaluation.py), not the Trainer's mean of batch means."""
    return {
        f"{prefix}_loss": metrics.get(f"{prefix}_token_loss"),
        f"{prefix}_perplexity": metrics.get(f"{prefix}_perplexity"),
        f"{prefix}_tokens": metrics.get(f"{prefix}_tokens"),
    }


def write_summary(output_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Written atomically, so a reader never sees half a file."""
    path = Path(output_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    try:
        temporary.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    except OSError:  # a full disk: no partial file beside the summary last written
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)
    return path


def read_summary(output_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(output_dir) / SUMMARY_FILE).read_text())


def peak_memory(fields: dict[str, Any]) -> tuple[str, float | None]:
    """The peak a per-device budget is about, and what it measures: GPU allocated, else host RSS."""
    if fields["memory_device"] == "cuda":
        return "GPU allocated", fields["memory_peak_allocated_gib_max"]
    return "host RSS", fields["memory_host_peak_rss_gib_max"]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C that a library's clean-up replaced with its own error (datasets' multi-process map
    raises TimeoutError while its workers die of the same SIGINT)."""
    seen = error.__context__
    while seen is not None and not isinstance(seen, KeyboardInterrupt):
        seen = seen.__context__
    return seen


class RunRecord:
    """The summary of a run in progress: filled in as the run goes, written when it ends.

    Only the main process writes. `until_exit` writes the record whatever ends the run: success,
    an error (status failed, with its first line) or Ctrl-C / SIGTERM (status interrupted), so a
    crashed run still says how far it got.
    """

    def __init__(
        self,
        output_dir: str,
        run_name: str,
        is_main_process: bool,
        clock: Callable[[], float] = time.time,
        started_at: float | None = None,
    ):
        """`started_at`: when the run started (run.py: its process's start, imports included)."""
        self.is_main_process = is_main_process
        self.clock = clock
        self.started = clock() if started_at is None else started_at
        self.fields: dict[str, Any] = dict.fromkeys(FIELDS)
        self.fields.update(
            status="running",
            run_name=run_name,
            output_dir=str(output_dir),
            wall_time_s=0.0,
            started_at=datetime.datetime.fromtimestamp(self.started, datetime.UTC).isoformat(
                timespec="seconds"
            ),
            data_notes=[],
            generations=[],
            loss_curve=[],
            ranks=[],
            arguments={},
        )

    def update(self, fields: dict[str, Any]) -> None:
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise KeyError(f"undocumented run-summary fields: {', '.join(unknown)}")
        self.fields.update(fields)

    def write(self, by_this_rank: bool = False) -> Path | None:
        """Rank 0 writes the summary; `by_this_rank`: this rank does, in its place (the watchdog's
        report when rank 0 is frozen)."""
        self.fields["wall_time_s"] = self.clock() - self.started
        if not (self.is_main_process or by_this_rank):
            return None
        return write_summary(self.fields["output_dir"], self.fields)

    def name_the_newest_checkpoint(self) -> None:
        """A run stopped between its saves says which checkpoint a --resume would continue from."""
        if self.fields.get("checkpoint") is None:
            newest = checkpoints_newest_first(self.fields["output_dir"])
            self.update({"checkpoint": str(newest[0]) if newest else None})

    @contextlib.contextmanager
    def until_exit(self) -> Iterator[RunRecord]:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            yield self
        except KeyboardInterrupt as interrupt:
            reason = str(interrupt) or "SIGINT"
            self.update({"status": "interrupted", "error": f"interrupted by {reason}"})
            self.name_the_newest_checkpoint()
            self.write()
            newest = self.fields["checkpoint"]
            raise KeyboardInterrupt(  # the line finetune prints: where the run can go on from
                f"{reason}; the run continues from {newest} with the same command and --resume"
                if newest
                else f"{reason}; no checkpoint was saved"
            ) from None
        except StoppedForResume as stop:
            self.update({"status": "interrupted", "error": str(stop)})
            self.write()
            raise
        except Diverged as diverged:
            self.update({"status": "diverged", "error": str(diverged)})
            self.name_the_newest_checkpoint()
            self.write()
            raise
        except BaseException as error:
            interrupt = _interrupt_behind(error)
            if interrupt is not None:
                reason = str(interrupt) or "SIGINT"
                self.update({"status": "interrupted", "error": f"interrupted by {reason}"})
                self.write()
                raise KeyboardInterrupt(*interrupt.args) from error
            message = first_line(error) if str(error).strip() else ""
            reason = reported_by_another_rank() or f"{type(error).__name__}: {message}".rstrip(": ")
            self.update({"status": "failed", "error": reason})
            self.write()
            raise
        else:
            self.update({"status": "completed"})
            self.write()
        finally:
            if signal.getsignal(signal.SIGTERM) is _raise_interrupt:  # else a stop for resume ignores it
                signal.signal(signal.SIGTERM, previous)


def format_report(fields: dict[str, Any]) -> str:
    """The end-of-run block: the numbers a user pastes into a report."""

    def number(value: Any, spec: str, unit: str = "") -> str:
        return "unknown" if value is None else f"{value:{spec}}{unit}"

    mfu_percent = None if fields["mfu"] is None else 100 * fields["mfu"]

    float8 = f" (float8 matmuls in {fields['fp8_layers']} layers)" if fields.get("fp8_layers") else ""
    lines = [
        f"finetune: {fields['status']} in {number(fields['wall_time_s'], '.0f', ' s')} of wall time"
        + (
            f", {fields['time_to_first_step_s']:.0f} s of it start-up"
            if fields.get("time_to_first_step_s") is not None
            else ""
        )
        + f" ({fields['strategy'] or fields['profile']}, {fields['world_size']} x {fields['device_name']})",
        f"  model       {fields['model']}: {number(fields['parameters'], ',')} parameters"
        + (
            f" ({fields['trainable_parameters']:,} trainable: {fields['peft']} adapters), "
            if fields.get("peft") and fields.get("trainable_parameters") is not None
            else ", "
        )
        + f"{fields['dtype']}{float8}, block {fields['block_size']}, "
        f"global batch {fields['global_batch_size']}",
        f"  training    {fields['steps']} steps, loss {number(fields['final_loss'], '.4f')} at the last log",
        f"  throughput  {number(fields['tokens_per_second'], ',.0f')} tokens/s "
        f"({number(fields['tokens_per_second_per_device'], ',.0f')} per device), "
        f"{number(fields['samples_per_second'], '.2f')} samples/s, step "
        f"{number(fields['step_time_median_s'], '.3f', ' s')} median, "
        f"{number(fields['step_time_p90_s'], '.3f', ' s')} p90 "
        f"(over {fields['throughput_steps']} steps after {fields['throughput_warmup_steps']} warm-up)",
        f"  MFU         {number(mfu_percent, '.1f', ' %')} "
        + (
            f"({number(fields['achieved_tflops_per_device'], '.1f')} of "
            f"{number(fields['peak_tflops'], '.1f')} TFLOP/s per device)"
            if fields["peak_tflops"] is not None
            else f"(no peak TFLOP/s known for {fields['device_name']}: --peak_tflops gives one)"
        ),
    ]
    if fields.get("batch_choice"):  # .get: summaries stored before the field existed are reported too
        lines.insert(
            2,
            f"  batch       micro batch {fields['micro_batch_size']} x accumulation "
            f"{fields['gradient_accumulation_steps']} x {fields['world_size']} process(es): "
            f"{fields['batch_choice']}",
        )
    if fields.get("time_to_first_step_s") is not None:
        phases = ", ".join(
            f"{phase} {seconds:.1f}" for phase, seconds in (fields.get("startup_phases_s") or {}).items()
        )
        lines.append(
            f"  start-up    {fields['time_to_first_step_s']:.1f} s to the first optimizer step"
            + (f" ({phases})" if phases else "")
        )
    if fields["memory_device"] == "cuda":
        lines.append(
            f"  GPU memory  peak {number(fields['memory_peak_allocated_gib_max'], '.2f', ' GiB')} allocated "
            f"(rank {fields['memory_peak_allocated_rank']}; mean "
            f"{number(fields['memory_peak_allocated_gib_mean'], '.2f')}), "
            f"{number(fields['memory_peak_reserved_gib_max'], '.2f', ' GiB')} reserved; "
            f"set-up peak {number(fields['memory_setup_peak_allocated_gib_max'], '.2f', ' GiB')}"
        )
    lines.append(
        f"  host memory peak RSS {number(fields['memory_host_peak_rss_gib_max'], '.2f', ' GiB')} "
        f"(rank {fields['memory_host_peak_rss_rank']}; mean "
        f"{number(fields['memory_host_peak_rss_gib_mean'], '.2f')})"
    )
    for split in ("eval", "test"):
        if fields[f"{split}_loss"] is not None:
            lines.append(
                f"  {split:<11} loss {fields[f'{split}_loss']:.4f}, perplexity "
                f"{fields[f'{split}_perplexity']:.2f} over {fields[f'{split}_tokens']:,} tokens"
            )
    lines.append(f"  summary     {Path(fields['output_dir']) / SUMMARY_FILE}")
    return "\n".join(lines)


def fields_table() -> str:
    rows = [f"| `{name}` | {kind} | {meaning} |" for name, (kind, meaning) in FIELDS.items()]
    return "\n".join(["| field | type | meaning |", "|---|---|---|", *rows])


if __name__ == "__main__":
    print(fields_table())
