"""run_summary.json: one flat record per run, written by rank 0 however the run ends.

FIELDS is the record's documentation and its schema: every field is always present, null when it
does not apply or was not known when the run ended (CUDA memory on a CPU run, throughput of a run
that failed before its first step, the model size of a run whose model did not load).
`python -m finetune.summary` prints FIELDS as the table of docs/measurements.md.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from finetune.checkpoint import checkpoints_newest_first
from finetune.errors import Diverged, StoppedForResume, first_line, reported_by_another_rank
from finetune.run_folder import SUMMARY_FILE

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
        "processes that each take a share of every global batch: world_size / sequence_parallel_size",
    ),
    "sequence_parallel_size": (
        "int?",
        "--sequence_parallel: processes that split each sample's tokens (1: every sample on one process)",
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
        "ZeRO-3 (full fine-tuning or adapters): the block classes gathered and reduced as one DeepSpeed "
        "leaf module each (the model's _no_split_modules, unless the DeepSpeed JSON names its own "
        "leaf_module); None otherwise",
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
    "fsdp_prefetch": (
        "int?",
        "FSDP profiles: the units ahead whose all-gathers each unit issues explicitly as its forward "
        "starts (--fsdp_prefetch, as FSDP2 holds it; 0: FSDP2's implicit prefetch); None otherwise",
    ),
    "ddp_gradient_buckets": (
        "str?",
        'DDP: "views" (each gradient a view into the bucket it is all-reduced in, '
        '--ddp_gradient_as_bucket_view) or "copies" (a copy beside each, torch\'s default); None otherwise',
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
        "or default (also where the profile's graphs are left off: gradient accumulation or "
        "checkpointing, flex attention)",
    ),
    "loss_compiled": (
        "bool?",
        "the loss compiled on its own, as where the model is compiled block by block (--compile_loss)",
    ),
    "dataset": ("str?", "--dataset as given"),
    "data_source": ("str?", "the absolute folder or Hub id it was read from"),
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
        "time_to_first_step_s by phase, in order: imports (with the arguments read and the devices and "
        "process group set up), data, model, wrapping (the Trainer and accelerate's prepare), first step "
        "(compilation in it)",
    ),
    "throughput_warmup_steps": ("int?", "first steps left out of the throughput"),
    "gc_interval": ("int?", "--gc_interval: the young generations collected every N steps (0: automatic)"),
    "gc_seconds_max": ("float?", "seconds in Python's garbage collection while training, max over ranks"),
    "gc_longest_pause_s": ("float?", "the longest single garbage collection while training, any rank"),
    "gc_full_collections_max": ("int?", "full (generation 2) collections while training, max over ranks"),
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
    "memory_eval_peak_allocated_gib_max": (
        "float?",
        "GPU peak of allocated tensors during the final evaluation, max over ranks",
    ),
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
    "eval_runtime_s": ("float?", "Trainer's eval_runtime: the final evaluation, its compiling included"),
    "evaluation_compiled": (
        "bool?",
        "evaluation ran compiled code: compiled training's model, unless it records CUDA graphs "
        "(then eager: graphs recorded for evaluation's batches held more)",
    ),
    "test_loss": ("float?", "the same on the test split (--eval_test_split)"),
    "test_perplexity": ("float?", "exp(test_loss)"),
    "test_tokens": ("int?", "test tokens predicted"),
    "test_runtime_s": ("float?", "the same for the test split"),
    "generations": ("list", "[{prompt, completion}] for --generation_prompt, from the saved model"),
    "loss_curve": ("list", "[{step, loss}] at every logging step"),
    "ranks": (
        "list",
        "per rank: rank, host, steps, its slowest measured steps [[step, seconds]], its garbage "
        "collections, and its memory readings at the end of training",
    ),
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


# The record's fields, group by group, as the run learns them.


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


def fields_table() -> str:
    rows = [f"| `{name}` | {kind} | {meaning} |" for name, (kind, meaning) in FIELDS.items()]
    return "\n".join(["| field | type | meaning |", "|---|---|---|", *rows])


if __name__ == "__main__":
    print(fields_table())
