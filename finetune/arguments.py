"""Command-line and recipe arguments: the project's dataclasses plus transformers' TrainingArguments.

Flags and YAML recipes go through one path (a recipe becomes flags, then the command line is
appended), so a recipe key means exactly what the flag of the same name means, and a flag given
after a recipe overrides it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser, SchedulerType, TrainingArguments

from finetune.config_files import parse_yaml
from finetune.deepspeed_json import TORCH_ADAMW
from finetune.divergence import DEFAULT_LOSS_SPIKE_FACTOR
from finetune.errors import FinetuneError, OneLineArgumentErrors, first_line
from finetune.garbage_collection import DEFAULT_GC_INTERVAL
from finetune.profiles import CUDA_GRAPH_MODES
from finetune.resolve import hub_offline
from finetune.run_flags import DataArguments, ModelArguments, check_lowest_values
from finetune.workload import FSDP_BLOCKS_PER_UNIT

# What the evaluation reports (the Trainer's loss, evaluation.token_weighted_loss's mean over tokens and
# its perplexity), each better lower: the names --metric_for_best_model may pick.
LOWER_IS_BETTER = ("loss", "token_loss", "perplexity")

# Flags that take "k1=v1,k2=v2", which a recipe may write as a YAML mapping; other mappings (the
# TrainingArguments that take a dict: --lr_scheduler_kwargs, ...) go as JSON.
KEY_VALUE_FLAGS = ("config_overrides", "optim_args")
# Flags whose one value is a comma-separated list: a recipe's YAML list for one is joined with commas.
# A list for any other single-valued flag is a mistake, which joined would become one odd value
# ("model 'gpt2,x' not found").
COMMA_SEPARATED_FLAGS = ("lora_target_modules", "report_to")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")


@dataclass
class FinetuneTrainingArguments(TrainingArguments):
    """TrainingArguments with the defaults a fine-tuning user expects and the project's few extras."""

    output_dir: str | None = field(default="outputs/run", metadata={"help": "Where the model and logs go."})
    per_device_train_batch_size: int = field(
        default=8,
        metadata={
            "aliases": ["--batch_size"],
            "help": "Micro batch per device, training and (unless --per_device_eval_batch_size) evaluation.",
        },
    )
    num_train_epochs: float = field(
        default=1.0, metadata={"aliases": ["--epochs"], "help": "Training epochs."}
    )
    lr_scheduler_type: str = field(
        default="cosine",
        metadata={"help": "Learning-rate schedule.", "choices": [kind.value for kind in SchedulerType]},
    )
    warmup_steps: float = field(
        default=0.05, metadata={"help": "Warm-up steps; a value below 1 is a fraction of all steps."}
    )
    logging_steps: float = field(default=10, metadata={"help": "Log every N optimizer steps."})
    logging_first_step: bool = field(default=True, metadata={"help": "Log the first step's loss."})
    # None until resolve_launch_settings: HfArgumentParser gives a bool field without a plain default
    # False, whatever its default_factory says.
    dataloader_pin_memory: bool | None = field(
        default=None,
        metadata={
            "nargs": "?",  # a bare switch is true, as TrainingArguments' own
            "const": True,
            "help": "Page-locked batches, copied to the GPU without waiting for it (default: on GPUs; "
            "the copy is non-blocking unless --accelerator_config says otherwise).",
        },
    )
    ddp_gradient_as_bucket_view: bool = field(
        default=False,
        metadata={
            "help": "DDP: make each gradient a view into the bucket it is all-reduced in, instead of a "
            "copy beside it (torch's DistributedDataParallel option): 4 bytes less GPU memory per "
            "trained parameter. Off by default, as torch has it, until its speed is measured on GPUs."
        },
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={
            "help": "DDP: look for parameters the forward left unused at every step. Off: every parameter of "
            "a causal LM (GPT-2's tied embedding included) takes part in each step, and the search costs a "
            "pass over the graph. Turn on for models that skip parameters (mixture-of-experts routing)."
        },
    )
    # HfArgumentParser only understands this union with None first, as TrainingArguments declares it.
    report_to: None | str | list[str] = field(  # noqa: RUF036
        default="tensorboard", metadata={"help": "tensorboard, none, ..."}
    )
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto: bf16 on GPUs that support it, fp16 with loss scaling on other GPUs, fp32 on CPU.",
            "choices": list(PRECISIONS),
        },
    )
    nvme_path: str | None = field(
        default=None,
        metadata={"help": "Folder on a fast local disk for the zero3_nvme (ZeRO-Infinity) profile."},
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "Continue from the newest complete checkpoint in --output_dir (start fresh if none)."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Delete an earlier run's results (summary, checkpoints, model, logs) in --output_dir "
            "before training, instead of refusing to start there."
        },
    )
    allow_world_size_change: bool = field(
        default=False,
        metadata={
            "help": "With --resume: continue a checkpoint on a different number of processes (and so a "
            "different --gradient_accumulation_steps). Without it a resume must match the checkpoint's "
            "profile, processes, batch geometry and run-defining flags."
        },
    )
    generation_prompt: list[str] | None = field(
        default=None,
        metadata={
            "help": "Prompts to complete with the saved model when training ends (printed, and in the "
            "run summary)."
        },
    )
    throughput_warmup_steps: int = field(
        default=5,
        metadata={"help": "First optimizer steps left out of throughput and MFU (compilation, allocation)."},
    )
    gc_interval: int = field(
        default=DEFAULT_GC_INTERVAL,
        metadata={
            "help": "Python's automatic garbage collection is off while training; every rank collects the "
            "young generations at the end of every N-th optimizer step instead (torchtitan's gc_freq): a "
            "full collection on one rank, mid-step, makes every rank wait for it. 0 leaves collection "
            "automatic. The summary's gc_* fields measure the collections either way."
        },
    )
    peak_tflops: float | None = field(
        default=None,
        metadata={
            "help": "Peak dense TFLOP/s of one device in the training dtype, for MFU on GPUs not in "
            "finetune/flops.py's table (which it overrides)."
        },
    )
    torch_compile: bool | None = field(
        default=None,
        metadata={
            "nargs": "?",  # a bare --torch_compile is true, as for every other switch
            "const": True,
            "help": "Compile the model with torch.compile (default: on with CUDA for every profile without "
            "offload, where it was measured faster: FSDP2 block by block, as the FSDP profiles ask "
            "accelerate to, ZeRO-3 its leaf blocks' forwards; off with offload, not timed, and on CPU).",
        },
    )
    chunked_loss: bool = field(
        default=False,
        metadata={
            "help": "Compute the loss a chunk of tokens at a time, in training and evaluation, never "
            "holding the full logits (finetune/losses.py): less memory, same loss, what long blocks "
            "need; GPT-2 and Llama-style models; under ZeRO-3 in evaluation only. Runs outside the "
            "compiled graph."
        },
    )
    fp8: bool = field(
        default=False,
        metadata={
            "help": "Multiply in float8 in every linear layer but the output layer (torchao's float8 "
            "training: dynamic scales per tensor; weights, optimizer and the rest stay in the run's "
            "precision). Needs torchao and a GPU of compute capability 8.9+ (runs on CPU, slowly); "
            "single, ddp and the FSDP profiles, full fine-tuning."
        },
    )
    compile_loss: bool = field(
        default=True,
        metadata={
            "help": "Where the model is compiled block by block (regional compilation, ZeRO-3's blocks), "
            "compile its loss too: eager, it keeps fp32 copies of the logits for backward. "
            "--no_compile_loss runs it eager."
        },
    )
    align_output_matmul: bool = field(
        default=True,
        metadata={
            "help": "Run the output layer's matmuls at a vocabulary padded to a multiple of 64 (same "
            "logits and gradients; GPT-2's 50,257 falls on slow unaligned kernels). "
            "--no_align_output_matmul keeps the layer as it is."
        },
    )
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={
            "help": "Replace NaN/inf step losses by the running mean in the logged loss. Off: it hides "
            "diverging runs and makes the host wait for the GPU at every micro-batch."
        },
    )
    loss_spike_factor: float = field(
        default=DEFAULT_LOSS_SPIKE_FACTOR,
        metadata={
            "help": "Stop as diverged when a logged loss exceeds this many times the median of the recent "
            "logged losses and a uniform guess's loss (ln of the vocabulary); 0 turns this check off. A "
            "non-finite gradient norm always stops the run."
        },
    )
    watchdog_s: float | None = field(
        default=None,
        metadata={
            "help": "End the run when no optimizer step ends for this many seconds, each rank's stack "
            "written to output_dir/hang-step<N>/ (finetune/watchdog.py). Default: 20x the median step, at "
            "least 600 s, from the first step on; 0 turns it off."
        },
    )
    fsdp_blocks_per_unit: int | None = field(
        default=None,
        metadata={
            "help": "FSDP profiles: shard N consecutive transformer blocks as one FSDP2 unit (one all-gather "
            "and one reduce-scatter for the N). Fewer, larger units keep the GPU ahead of FSDP's per-unit "
            "host work, for N blocks' unsharded parameters in flight (finetune/fsdp_units.py; the planner "
            "counts them). Default: "
            f"{FSDP_BLOCKS_PER_UNIT} under the FSDP profiles (docs/speed.md), 1 under the others."
        },
    )
    fsdp_prefetch: int = field(
        default=0,
        metadata={
            "help": "FSDP profiles: each unit issues the all-gathers of the next N units when its forward "
            "starts, and of the previous N when its backward starts (FSDP2's explicit prefetch), instead "
            "of each all-gather waiting for the host to reach its unit; N units' unsharded parameters in "
            "flight (the planner counts them: docs/planner.md). 0: FSDP2's implicit prefetch (one unit "
            "ahead in the backward; finetune/fsdp_units.py)."
        },
    )
    sequence_parallel: int = field(
        default=1,
        metadata={
            "help": "zero3 and fsdp profiles: split each sample's tokens over groups of N processes "
            "(DeepSpeed Ulysses under zero3, torch's ring attention on CUDA GPUs under fsdp, both through "
            "accelerate's ParallelismConfig): activations per GPU shrink N-fold, so a block N times longer "
            "fits. N divides the processes (and, for Ulysses, the attention heads); the processes / N take "
            "their own samples (docs/long-context.md)."
        },
    )
    profile_memory: bool = field(
        default=False,
        metadata={
            "help": "Print memory per rank and per phase of the first step (load, forward, backward, "
            "optimizer step)."
        },
    )
    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Samples per optimizer step over all processes. The micro batch becomes the largest that "
            "divides it per process and is predicted to fit the profile on the GPUs (finetune plan's memory "
            "model, docs/planner.md), the accumulation the rest. With --batch_size or "
            "--gradient_accumulation_steps those are kept and must make it exactly."
        },
    )
    gpu_memory_gib: float | None = field(
        default=None,
        metadata={
            "help": "GiB per GPU that --global_batch_size plans the micro batch for (default: the visible "
            "GPU's; without a GPU the micro batch is at most 8, the default --batch_size)."
        },
    )
    # Set by parse_arguments and planner.apply_global_batch, not flags: which batch flags (BATCH_FLAGS)
    # the command line gave (a flag given at its default value still fixes it), and why the batch is
    # what it is.
    batch_flags_given: frozenset[str] = field(default=frozenset(), init=False, repr=False)
    batch_choice: str | None = field(default=None, init=False, repr=False)
    # Set by parse_arguments from --attn_implementation: whether a profile's CUDA graphs can be kept
    # (BatchGeometry.apply).
    attention_kernel: str = field(default="sdpa", init=False, repr=False)

    @property
    def resumes_a_run(self) -> bool:
        """--resume, or transformers' own --resume_from_checkpoint PATH."""
        return self.resume or bool(self.resume_from_checkpoint)

    def __post_init__(self) -> None:
        """Check the values and fill the defaults that depend on nothing else; finish nothing.

        TrainingArguments' own __post_init__ sets up the devices (and, under a launcher, the process
        group), and what it sets up depends on the launch: it runs in `launch_settings.set_up_devices`, so
        that parsing reads no launcher variable and touches no device or folder.
        """
        check_lowest_values(self)
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise FinetuneError(f"--peak_tflops must be positive, got {self.peak_tflops}")
        if self.gpu_memory_gib is not None and self.gpu_memory_gib <= 0:
            raise FinetuneError(f"--gpu_memory_gib must be positive, got {self.gpu_memory_gib}")
        if self.gpu_memory_gib is not None and self.global_batch_size is None:
            raise FinetuneError("--gpu_memory_gib is only used with --global_batch_size")
        self._resolve_checkpointing_alias()
        if self.torch_compile_mode in CUDA_GRAPH_MODES and self.gradient_checkpointing:
            raise FinetuneError(
                f"--torch_compile_mode {self.torch_compile_mode} records CUDA graphs, which "
                "--gradient_checkpointing's recomputation breaks (fsdp re-recorded them at every step, "
                "zero3 failed reading overwritten outputs): use --torch_compile_mode default, "
                "or no checkpointing"
            )
        if self.fp8 and importlib.util.find_spec("torchao") is None:
            raise FinetuneError("--fp8 needs torchao: pip install 'finetune[fp8]'")
        self._check_values()
        if self.ddp_bucket_cap_mb is None:
            self.ddp_bucket_cap_mb = DDP_BUCKET_CAP_MB
        if self.precision != "auto":
            if self.bf16 or self.fp16:
                raise FinetuneError("give either --precision or --bf16/--fp16, not both")
            self.bf16 = self.precision == "bf16"
            self.fp16 = self.precision == "fp16"

    def _resolve_checkpointing_alias(self) -> None:
        """--gradient_checkpointing (the flag the project documents) and --activation_checkpointing (its
        newer name, in the transformers versions that have it) as one bool, now: TrainingArguments
        resolves them only in its own __post_init__, at the launch, and the planner reads the flag
        before. The newer name wins where both are given, as in TrainingArguments; setting both keeps
        its deprecation warning for the documented flag away."""
        newer = getattr(self, "activation_checkpointing", None)
        asked = bool(self.gradient_checkpointing if newer is None else newer)
        self.gradient_checkpointing = asked
        if hasattr(self, "activation_checkpointing"):
            self.activation_checkpointing = asked

    def _check_values(self) -> None:
        """Values TrainingArguments takes without a word and the run then misuses or fails on later."""
        if self.max_steps == 0 or self.max_steps < -1:
            raise FinetuneError(
                f"--max_steps must be a number of steps, or -1 for --epochs; got {self.max_steps}"
            )
        if self.max_steps == -1 and not (math.isfinite(self.num_train_epochs) and self.num_train_epochs > 0):
            raise FinetuneError(f"--epochs must be a positive number, got {self.num_train_epochs}")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise FinetuneError(
                "--save_total_limit must be at least 1 (leave it out to keep every checkpoint), "
                f"got {self.save_total_limit}"
            )
        if not math.isfinite(self.learning_rate) or self.learning_rate <= 0:
            raise FinetuneError(f"--learning_rate must be a positive number, got {self.learning_rate}")
        for flag, value in (("--output_dir", self.output_dir), ("--nvme_path", self.nvme_path)):
            too_long = [part for part in Path(value or "").parts if len(os.fsencode(part)) > NAME_MAX]
            if too_long:
                raise FinetuneError(f"{flag}: the folder name {too_long[0][:40]}... is over {NAME_MAX} bytes")
            if value and Path(value).exists() and not Path(value).is_dir():
                raise FinetuneError(f"{flag} {value} is a file: give a folder")
        if self.run_name:
            check_run_name(self.run_name, "--run_name")
        check_seed(self.seed)
        for flag, beta in (("--adam_beta1", self.adam_beta1), ("--adam_beta2", self.adam_beta2)):
            if not 0 <= beta < 1:  # AdamW's own refusal is a traceback once the model is built
                raise FinetuneError(f"{flag} must be at least 0 and below 1, got {beta}")
        if self.torch_compile_mode is not None:
            check_compile_mode(self.torch_compile_mode)
        self.report_to = reporting_integrations(self.report_to)
        check_optimizer(self)
        if self.label_smoothing_factor != 0:
            raise FinetuneError(
                "--label_smoothing_factor: finetune trains on and reports the model's own causal-LM loss "
                "(perplexity is its exponential; --chunked_loss and --sequence_parallel compute it without "
                "the logits the Trainer's label smoother reads): label smoothing is not supported"
            )
        for flag, value in (("--fsdp", self.fsdp), ("--fsdp_config", self.fsdp_config)):
            if value:  # TrainingArguments' own FSDP switch, beside the launch's: they would disagree
                raise FinetuneError(
                    f"{flag}: FSDP comes from the profile here (--profile fsdp or fsdp_grad_op, "
                    "accelerate_configs/fsdp.yaml), which the planner, checkpoints and summary read"
                )
        self._check_best_model_flags()
        if self.auto_find_batch_size:  # accelerate's find_executable_batch_size, gradient accumulation kept
            raise FinetuneError(
                "--auto_find_batch_size would shrink the micro batch at an out-of-memory, and with it the "
                "global batch the summary and a resume record: --global_batch_size N plans the largest "
                "micro batch that fits (`finetune plan` shows it)"
            )
        if self.push_to_hub and hub_offline():  # else the Trainer's traceback when it creates the repo
            raise FinetuneError("--push_to_hub needs the Hugging Face Hub, and HF_HUB_OFFLINE is set")

    def _check_best_model_flags(self) -> None:
        """--save_strategy best needs evaluations during training; --metric_for_best_model is among what
        the evaluation reports, lower being better for each: transformers' default calls every name not
        ending in "loss" greater-is-better, so perplexity would keep the worst checkpoint, and a name the
        evaluation lacks is a KeyError after training."""
        if self.save_strategy == "best" and getattr(self.eval_strategy, "value", self.eval_strategy) == "no":
            raise FinetuneError(
                "--save_strategy best saves when an evaluation finds a better model, and none runs during "
                "training: add --eval_strategy steps (with --eval_steps) or epoch"
            )
        if self.metric_for_best_model is None and self.save_strategy == "best":
            self.metric_for_best_model = "loss"  # as transformers picks for --load_best_model_at_end
        metric = self.metric_for_best_model
        if metric is None:
            return
        if metric.removeprefix("eval_") not in LOWER_IS_BETTER:
            raise FinetuneError(
                f"--metric_for_best_model {metric}: the evaluation reports {', '.join(LOWER_IS_BETTER)}"
            )
        if self.greater_is_better:
            raise FinetuneError(f"--greater_is_better: a lower {metric} is the better model")
        self.greater_is_better = False


def check_optimizer(arguments: TrainingArguments) -> None:
    """--optim and --optim_args as the Trainer reads them, asked of transformers now: a malformed
    --optim_args or an optimizer whose package is missing is otherwise a traceback when the Trainer
    builds the optimizer, after data and model. torch's own AdamW, the default, needs no asking."""
    optim, optim_args = arguments.optim, arguments.optim_args
    if optim_args:
        malformed = [item for item in optim_args.replace(" ", "").split(",") if item.count("=") != 1]
        if malformed:
            raise FinetuneError(f"--optim_args: {malformed[0]!r} is not key=value (give k1=v1,k2=v2)")
    if optim in TORCH_ADAMW:
        return
    from transformers import Trainer

    try:
        Trainer.get_optimizer_cls_and_kwargs(arguments)
    except ImportError as error:
        raise FinetuneError(f"--optim {optim}: {first_line(error)}") from None
    except ValueError as error:
        if "model" not in str(error):  # what it checks against the model waits for the model
            raise FinetuneError(f"--optim {optim}: {first_line(error)}") from None


def check_compile_mode(mode: str) -> None:
    """A mode torch.compile knows, asked of the installed torch (its list changes between releases):
    an unknown one is otherwise a traceback at the first compiled forward, after data and model."""
    import torch._inductor

    modes = list(torch._inductor.list_mode_options())
    if mode not in modes:
        raise FinetuneError(f"--torch_compile_mode {mode}: torch knows {', '.join(modes)}")


def reporting_integrations(report_to: str | list[str] | None) -> str | list[str] | None:
    """--report_to as a list of names (comma-separated, as a recipe's list becomes), each one transformers
    knows and finds installed: an unknown name or a missing package is otherwise a traceback when the
    Trainer is built, after the data and the model. "all" and "none" stay as TrainingArguments reads them."""
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    if report_to is None or report_to in ("all", "none", ["all"], ["none"]):
        return report_to
    given = report_to.split(",") if isinstance(report_to, str) else report_to
    names = list(dict.fromkeys(name.strip() for name in given if name.strip()))
    unknown = [name for name in names if name not in INTEGRATION_TO_CALLBACK]
    if unknown:
        known = ", ".join(["none", "all", *INTEGRATION_TO_CALLBACK])
        raise FinetuneError(f"--report_to {unknown[0]}: not an integration transformers knows ({known})")
    missing = [name for name in names if name not in get_available_reporting_integrations()]
    if missing:
        raise FinetuneError(f"--report_to {missing[0]}: its package is not installed here")
    return names


NAME_MAX = 255  # bytes in one file or folder name on Linux and macOS file systems


LARGEST_SEED = 2**32 - 1  # transformers' set_seed seeds numpy too, whose seeds are 32-bit


def check_seed(seed: int) -> None:
    """A seed every random generator set_seed seeds accepts (numpy's is the narrowest), refused here
    rather than as numpy's traceback once the model is built."""
    if not 0 <= seed <= LARGEST_SEED:
        raise FinetuneError(f"--seed must be between 0 and {LARGEST_SEED}, got {seed}")


def check_run_name(name: str, source: str) -> None:
    """A run name becomes a folder under output_dir/runs: one path component that the file system takes."""
    if "/" in name or "\\" in name or name in (".", ".."):
        raise FinetuneError(
            f"{source} {name!r}: a run name is one folder name, without / or \\ and not . or .."
        )
    size = len(name.encode())
    if size > NAME_MAX:
        raise FinetuneError(f"{source}: a run name is a folder name of at most {NAME_MAX} bytes, got {size}")


# DDP's gradient buckets, larger than torch's 25 MB default: a compiled step then spends less time in
# many small all-reduces, which was measurably faster on two GPUs (docs/speed.md).
# Only DDP reads it; FSDP and DeepSpeed have their own.
DDP_BUCKET_CAP_MB = 200


ARGUMENT_CLASSES = (ModelArguments, DataArguments, FinetuneTrainingArguments)


class RunFlagParser(OneLineArgumentErrors, HfArgumentParser):
    """run.py's flags, declared by the dataclasses above."""


def make_parser() -> HfArgumentParser:
    return RunFlagParser(ARGUMENT_CLASSES, prog="finetune/run.py", allow_abbrev=False)


def known_keys() -> set[str]:
    """Every field name and alias (without dashes) that a recipe may use."""
    keys = set()
    for cls in ARGUMENT_CLASSES:
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            keys.add(f.name)
            keys.update(alias.lstrip("-") for alias in f.metadata.get("aliases", []))
    return keys


def recipe_to_flags(path: Path) -> list[str]:
    """A YAML recipe as command-line flags, so recipes and flags share one parser."""
    try:
        text = path.read_text()
    except OSError as error:
        raise FinetuneError(f"{path}: cannot read recipe: {error.strerror or error}") from None
    recipe = parse_yaml(text, path)
    if not isinstance(recipe, dict):
        raise FinetuneError(f"{path}: a recipe is a mapping of argument names to values")
    unknown = sorted(set(recipe) - known_keys())
    if unknown:
        parser = make_parser()
        hints = [hint for key in unknown if (hint := flag_hint(f"--{key}", parser))]
        raise FinetuneError(
            "; ".join([f"{path}: unknown key(s) {', '.join(unknown)}", *hints])
            + " (see `finetune/run.py --help`)"
        )
    flags: list[str] = []
    actions = make_parser()._option_string_actions
    for key, value in recipe.items():
        if value is None or value == []:
            continue
        flags.append(f"--{key}")
        if isinstance(value, list) and actions[f"--{key}"].nargs in ("+", "*"):
            flags.extend(str(item) for item in value)  # a list flag: each item one value, commas kept
        elif isinstance(value, list) and key in COMMA_SEPARATED_FLAGS:
            flags.append(",".join(str(item) for item in value))
        elif isinstance(value, list):
            raise FinetuneError(f"{path}: {key} takes one value, not a list: {value}")
        elif isinstance(value, dict) and key in KEY_VALUE_FLAGS:
            flags.append(",".join(f"{name}={item}" for name, item in value.items()))
        elif isinstance(value, dict):
            flags.append(json.dumps(value))
        else:
            flags.append(str(value).lower() if isinstance(value, bool) else str(value))
    return flags


def expand_recipe(argv: list[str]) -> list[str]:
    """`run.py recipe.yaml --flag x` → the recipe's flags followed by the explicit ones."""
    if argv and argv[0].endswith((".yaml", ".yml")) and not argv[0].startswith("-"):
        return recipe_to_flags(Path(argv[0])) + argv[1:]
    return argv


def parse_arguments(
    argv: list[str] | None = None,
) -> tuple[ModelArguments, DataArguments, FinetuneTrainingArguments]:
    """Flags or a recipe as the three dataclasses, their values checked.

    Reads no launcher variable and creates nothing, so the `finetune` commands parse run flags with
    it before launching; the process that trains then resolves the launch (finetune/resolved.py).
    """
    argv = expand_recipe(list(argv) if argv is not None else sys.argv[1:])
    parser = make_parser()
    try:
        model_args, data_args, training_args, unused = parser.parse_args_into_dataclasses(
            args=argv, return_remaining_strings=True
        )
    except ValueError as error:  # a dataclass's own check (TrainingArguments' __post_init__)
        raise FinetuneError(first_line(error)) from None
    if unused:
        late = next((arg for arg in unused if arg.endswith((".yaml", ".yml"))), None)
        if late:
            raise FinetuneError(f"a recipe comes before the flags: {late} was given after them")
        hints = [hint for arg in unused if arg.startswith("--") and (hint := flag_hint(arg, parser))]
        parser.error("; ".join([f"unrecognized arguments: {' '.join(unused)}", *hints]))
    for arguments in (model_args, data_args, training_args):
        not_finite = [
            (f.name, value)
            for f in dataclasses.fields(arguments)
            if not_a_finite_number(value := getattr(arguments, f.name, None))
        ]
        if not_finite:
            name, value = not_finite[0]
            raise FinetuneError(f"--{name} is {value}: give a finite number")
    training_args.batch_flags_given = flags_given(argv, BATCH_FLAGS)
    training_args.attention_kernel = model_args.attn_implementation
    model_args.model = absolute_if_local(model_args.model)
    model_args.tokenizer = model_args.tokenizer and absolute_if_local(model_args.tokenizer)
    return model_args, data_args, training_args


# Flags of transformers' example scripts (run_clm.py), of TRL's SFT script and of transformers 4 that a
# user copying a tutorial brings, with what this parser calls them.
ANSWERS_ONLY = "give nothing: labels are on the answers only by default (--train_on_prompt adds the prompts)"
FLAGS_NAMED_OTHERWISE = {
    "--warmup_ratio": "use --warmup_steps (below 1, a fraction of the steps: transformers 5 folded it in)",
    "--evaluation_strategy": "use --eval_strategy",
    "--dataset_config_name": "use --dataset_config",
    "--tokenizer_name": "use --tokenizer",
    "--train_file": "use --dataset FILE",
    "--max_seq_length": "use --block_size",
    "--max_length": "use --block_size",
    "--dataset_text_field": "use --text_column",
    "--use_peft": "use --peft lora",
    "--lora_r": "use --lora_rank",
    "--completion_only_loss": ANSWERS_ONLY,
    "--assistant_only_loss": ANSWERS_ONLY,
    "--logging_dir": "use --run_name (the TensorBoard log is output_dir/runs/RUN_NAME)",
}


def flag_hint(argument: str, parser: HfArgumentParser) -> str | None:
    """What an unrecognized flag is called here: another tool's name for it, else the closest flag of
    this parser (a typo)."""
    flag = argument.split("=", 1)[0]
    if flag in FLAGS_NAMED_OTHERWISE:
        return f"for {flag} {FLAGS_NAMED_OTHERWISE[flag]}"
    close = difflib.get_close_matches(flag, parser._option_string_actions, n=1, cutoff=0.8)
    return f"did you mean {close[0]}?" if close else None


def not_a_finite_number(value: Any) -> bool:
    """A float flag given as nan, which every range check compares false with and lets through, or as
    inf, which passes them and is a traceback where the Trainer counts steps with it (--warmup_steps,
    --logging_steps); the flags that can be off say so with 0."""
    return isinstance(value, float) and not math.isfinite(value)


BATCH_FLAGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "per_device_eval_batch_size")


def absolute_if_local(name: str) -> str:
    """A model or tokenizer given as a local path, made absolute: checkpoints, adapter configs and
    summaries record it, and `finetune export` or a resume may run from another directory. A name
    (gpt2, a Hub id, a folder of $FINETUNE_DATA_DIR) stays a name, portable between machines."""
    path = Path(name).expanduser()
    return os.path.abspath(path) if path.exists() else name


def flags_given(argv: list[str], names: tuple[str, ...]) -> frozenset[str]:
    """Which of `names` the command line or its recipe set, whatever the value: a flag given at its
    default still fixes it. argparse does not tell, so a second parser whose defaults for them are a
    marker no flag can give reads the same arguments."""
    unset = object()
    probe = make_parser()
    probe.set_defaults(**dict.fromkeys(names, unset))
    given, _ = probe.parse_known_args(argv)
    return frozenset(name for name in names if getattr(given, name) is not unset)


def as_record(*arguments: Any) -> dict[str, Any]:
    """The arguments of a run as plain JSON-able data, for the run summary."""
    record = {}
    for args in arguments:
        values = args.to_dict() if hasattr(args, "to_dict") else dataclasses.asdict(args)
        record.update({k: v for k, v in values.items() if _jsonable(v)})
    return record


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True
