"""`finetune` command line: the commands below, each with its own --help.

Before a run, `profiles`, `plan` and `doctor` say what fits and whether the machine is ready; `run`,
`compare` and `slurm` launch finetune/run.py under a profile; `export`, `eval` and `generate` work
on what a run leaves behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import torch

from finetune.errors import RESUMABLE_EXIT_CODE, FinetuneError, OneLineArgumentErrors, exit_on_user_error
from finetune.launch import RUN_SCRIPT, Placement, launch_command, resolved_profile_file
from finetune.launched import PROFILE_VARIABLE, precision_on
from finetune.layout import ParallelLayout
from finetune.profiles import (
    Strategy,
    available_profiles,
    copy_profile,
    fastest_first,
    load_profile,
    shipped_strategies,
    with_shipped_recipe,
)
from finetune.resolve import pin_data_dir
from finetune.run_flags import DataArguments, ModelArguments, add_run_flags

if TYPE_CHECKING:
    from finetune.arguments import FinetuneTrainingArguments
    from finetune.memory_model import Workload

PLACEMENT_OPTIONS = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")


def profiles_command(args: argparse.Namespace) -> int:
    """Print every profile's strategy, fastest first; a broken one prints its error and fails the command.

    With --copy, write an editable copy of one profile instead.
    """
    if args.copy:
        if args.files:
            raise FinetuneError("give profile files to check or --copy NAME DIR, not both")
        name, folder = args.copy
        copies = copy_profile(name, Path(folder))
        print(f"finetune: wrote {' and '.join(str(path) for path in copies)}; edit them, then run from here:")
        print(f"    finetune run --profile {copies[0]} [run flags]")
        return 0
    failures = 0
    strategies = []
    for path in [Path(p) for p in args.files] if args.files else available_profiles():
        try:
            strategies.append(load_profile(path).strategy)
        except FinetuneError as error:
            failures += 1
            print(f"finetune: error: {error}", file=sys.stderr)
    for strategy in fastest_first(strategies):
        print(f"{strategy.name:<15} {strategy.summary}")
    return 1 if failures else 0


def placement_of(options: argparse.Namespace) -> Placement:
    return Placement(**{name: getattr(options, name) for name in PLACEMENT_OPTIONS})


def parse_run_flags(
    run_args: list[str], defaults: tuple[str, ...] = ()
) -> tuple[ModelArguments, DataArguments, FinetuneTrainingArguments]:
    """The run flags (a recipe first, if any) as finetune/run.py will read them, with the same parser.

    `defaults` are flags placed before the recipe's, so that the recipe and the command line override
    them. A mistake in the run flags stops the command here, before anything is launched.
    """
    from finetune.arguments import expand_recipe, parse_arguments
    from finetune.converters import refuse_incompatible

    model_args, data_args, training_args = parse_arguments([*defaults, *expand_recipe(run_args)])
    refuse_incompatible(model_args, training_args)  # the flags alone; run.py checks the launch too
    return model_args, data_args, training_args


DOCTOR_SCRIPT = Path(__file__).resolve().parent / "doctor.py"
ORPHANED_RANKS_WAIT_S = 600.0  # a checkpoint of a large model takes minutes to write


def run_command(options: argparse.Namespace, run_args: list[str]) -> int:
    run_args = with_shipped_recipe(run_args)
    _, _, training_args = parse_run_flags(run_args)
    if options.profile == "auto":
        options.profile, reason = auto_profile(run_args, options.num_processes)
        print(f"finetune: --profile auto picked {options.profile}: {reason}", file=sys.stderr)
    if options.doctor:
        code = launch(options, run_args, DOCTOR_SCRIPT)
        if code != 0:
            print("finetune: --doctor: a check failed (the table above): no run started", file=sys.stderr)
            return code
    code = launch(options, run_args, RUN_SCRIPT, training_args.output_dir)
    if code < 0:  # the launcher was killed (kill -9): its ranks stop on their own and may have saved
        return orphaned_ranks_outcome(Path(training_args.output_dir), signal.Signals(-code))
    return code


def doctor_command(options: argparse.Namespace, run_args: list[str]) -> int:
    run_args = with_shipped_recipe(run_args)
    parse_run_flags(run_args)
    return launch(options, run_args, DOCTOR_SCRIPT)


def launch(
    options: argparse.Namespace, run_args: list[str], script: Path, output_dir: str | None = None
) -> int:
    """`script` (run.py or doctor.py) on the ranks the profile and placement ask for: the launcher's
    exit code, negative when the launcher itself was killed.

    The printed command runs again as it is: the profile copy it names (its DeepSpeed JSON made
    absolute) is kept in output_dir/.launch/, where it also records how the run was launched; where
    that folder cannot be written, a temporary copy is used and removed at the end.
    """
    profile = load_profile(options.profile)
    with contextlib.ExitStack() as stack:
        folder = kept_launch_folder(output_dir) or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="finetune-profile-"))
        )
        config_file = resolved_profile_file(profile, folder)
        command = launch_command(profile, config_file, placement_of(options), run_args, script)
        print("finetune: " + " ".join(command), file=sys.stderr)
        environment = {**os.environ, PROFILE_VARIABLE: profile.name}
        with subprocess.Popen(command, env=environment) as launcher, forwarding_stop_signals(launcher):
            try:
                code = launcher.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the launcher too: let it stop its ranks
                code = launcher.wait()
    return code


def kept_launch_folder(output_dir: str | None) -> Path | None:
    from finetune.run_folder import LAUNCH_DIR

    if output_dir is None:
        return None
    folder = Path(output_dir) / LAUNCH_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@contextlib.contextmanager
def forwarding_stop_signals(launcher: subprocess.Popen) -> Iterator[None]:
    """A stop signal sent to this process alone (`kill PID`) reaches the ranks, and this process waits.

    As torchrun and accelerate launch pass their signals on, this process passes SIGTERM and SIGUSR1 to
    the processes the launcher started (the ranks, which save a checkpoint at the next step end and exit
    75) and goes on waiting for the launcher, whose exit code is then the run's. Not to the launcher
    itself: torch elastic would stop its ranks after 30 s, maybe in the middle of a save. Before any
    rank exists, the launcher gets it. A signal sent to the whole process group (SLURM, Ctrl-C) reached
    the ranks already; the second copy is the same request to them.
    """

    def forward(signum: int, frame: object) -> None:
        try:
            ranks = psutil.Process(launcher.pid).children()
        except psutil.NoSuchProcess:
            return
        for process in ranks or [psutil.Process(launcher.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signum)

    previous = {number: signal.signal(number, forward) for number in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def orphaned_ranks_outcome(output_dir: Path, killed_by: signal.Signals) -> int:
    """The exit code of a run whose launcher was killed: 75 when its ranks saved a checkpoint and stopped
    (finetune/outputs.py makes ranks stop when their launcher dies), so that a requeue resumes.

    The ranks outlive the launcher for as long as their save takes: they are waited for through the
    output_dir lock rank 0 holds until it exits, then the run summary says what they did.
    """
    from finetune.outputs import read_holder
    from finetune.run_folder import LOCK_FILE
    from finetune.summary import read_summary

    deadline = time.monotonic() + ORPHANED_RANKS_WAIT_S
    while time.monotonic() < deadline:
        holder = read_holder(output_dir / LOCK_FILE)
        if holder is None or holder.is_gone():
            break
        time.sleep(0.5)
    try:
        summary = read_summary(output_dir)
    except (OSError, ValueError):
        summary = {}
    checkpoint = summary.get("checkpoint")
    if summary.get("status") == "interrupted" and checkpoint:
        print(
            f"finetune: the launcher was killed ({killed_by.name}); its ranks saved {checkpoint} and "
            "stopped: run the same command with --resume",
            file=sys.stderr,
        )
        return RESUMABLE_EXIT_CODE
    print(f"finetune: the launcher was killed ({killed_by.name}); no checkpoint was saved", file=sys.stderr)
    return 128 + killed_by


def check_export_source(checkpoint: Path) -> None:
    """A run's output_dir given for one of its checkpoints: say which to pass."""
    from finetune.checkpoint import checkpoints_newest_first
    from finetune.run_folder import MANIFEST

    newest = checkpoints_newest_first(checkpoint) if checkpoint.is_dir() else []
    if newest and not (checkpoint / MANIFEST).exists():
        raise FinetuneError(
            f"{checkpoint} is a run's output_dir, not a checkpoint: pass one of its checkpoints, the newest "
            f"being {newest[0]} (its final model is already a model folder: eval and generate take it)"
        )


def check_export_folder(checkpoint: Path, folder: Path, overwrite: bool) -> None:
    """An export never replaces a run's results (a finished run's, or a live one's), and replaces other
    files only when asked to."""
    from finetune.outputs import read_holder
    from finetune.run_folder import CHECKPOINT_PREFIX, LOCK_FILE, SUMMARY_FILE

    run_dir = checkpoint.resolve().parent
    target = folder.resolve()
    if target == run_dir:
        raise FinetuneError(
            f"{folder} is the output_dir of the run that saved {checkpoint}: exporting there would replace "
            "its final model; choose another folder"
        )
    if target == checkpoint.resolve() or checkpoint.resolve() in target.parents:
        raise FinetuneError(f"{folder} is inside the checkpoint {checkpoint}: choose another folder")
    if folder.exists() and not folder.is_dir():
        raise FinetuneError(f"{folder} is a file, not a folder: choose a folder to export into")
    holder = read_holder(folder / LOCK_FILE)
    if holder is not None and not holder.is_gone():
        raise FinetuneError(
            f"{folder} is the output_dir of a running run (pid {holder.pid}): choose another folder"
        )
    if (folder / SUMMARY_FILE).exists() or any(folder.glob(f"{CHECKPOINT_PREFIX}*")):
        raise FinetuneError(
            f"{folder} holds a run's results ({SUMMARY_FILE}, checkpoints): --overwrite replaces an earlier "
            "export, never a run; choose another folder"
        )
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise FinetuneError(f"{folder} is not empty: pass --overwrite to replace what is in it")


def export_command(options: argparse.Namespace) -> int:
    from finetune.checkpoint import load_weights_only
    from finetune.export import export_checkpoint

    check_export_source(Path(options.checkpoint))
    check_export_folder(Path(options.checkpoint), Path(options.output_dir), options.overwrite)
    load_weights_only()
    folder = export_checkpoint(
        options.checkpoint, options.output_dir, options.dtype, options.merge, options.base_model
    )
    print(f"finetune: exported {options.checkpoint} to {folder} ({options.dtype})")
    return 0


def eval_command(options: argparse.Namespace) -> int:
    from finetune.evaluation import AnswerCheck, evaluate_saved_model
    from finetune.launched import Launch

    if not options.generate and (options.answer_pattern is not None or options.max_new_tokens is not None):
        raise FinetuneError("--answer_pattern and --max_new_tokens score generated answers: add --generate")
    max_new_tokens = 256 if options.max_new_tokens is None else options.max_new_tokens
    if options.stop and not options.generate:
        raise FinetuneError("--stop ends generated answers: add --generate")
    answers = (
        AnswerCheck(options.answer_pattern, max_new_tokens, tuple(options.stop)) if options.generate else None
    )
    data_args = DataArguments(**{name: getattr(options, name) for name in EVAL_DATA_FLAGS})
    result = evaluate_saved_model(
        options.model,
        data_args,
        options.split,
        options.block_size,
        options.stride,
        options.batch_size,
        options.max_tokens,
        answers,
        options.max_examples,
    )
    completions = result.pop("_completions", None)
    if Launch.from_environment().rank == 0:
        print(json.dumps(result))
        if options.output:
            Path(options.output).write_text(json.dumps(result, indent=2) + "\n")
        if completions is not None:
            write_completions(
                completions,
                options.completions or completions_path(options.output, options.model, options.split),
            )
    return 0


def completions_path(output: str | None, model: str, split: str) -> str:
    """Beside --output (RESULT.completions.jsonl), else in the evaluated model's folder, where they
    stay with what they judge (eval-SPLIT.completions.jsonl); a Hub name has none: the current one."""
    if output:
        return str(Path(output).with_suffix(".completions.jsonl"))
    folder = Path(model) if Path(model).is_dir() else Path()
    return str(folder / f"eval-{split}.completions.jsonl")


def write_completions(records: list[dict], path: str) -> None:
    """Every prompt, completion, extracted answer and reference: a wrong answer can be read."""
    try:
        with open(path, "w", encoding="utf-8") as stream:
            stream.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    except OSError as error:
        raise FinetuneError(f"--completions {path}: cannot write it ({error.strerror})") from None
    print(f"finetune: {len(records)} completions written to {path}", file=sys.stderr)


COMPLETION_MARK = "\u2192"  # "→", printed between a plain prompt and its completion


def generate_command(options: argparse.Namespace) -> int:
    from finetune.generate import Chat, Sampling, generate, read_prompts

    if options.system is not None and not options.chat:
        raise FinetuneError("--system is the system message of a --chat conversation: add --chat")
    prompts = read_prompts(options.prompt, options.prompts_file)
    sampling = Sampling(
        max_new_tokens=options.max_new_tokens,
        temperature=options.temperature,
        top_k=options.top_k,
        top_p=options.top_p,
        greedy=options.greedy,
        seed=options.seed,
        stop=tuple(options.stop),
    )
    chat = Chat(options.system) if options.chat else None
    for prompt, completion in zip(prompts, generate(options.model, prompts, sampling, chat), strict=True):
        # the marker shows where the prompt ends and the model's text begins
        print(
            f"user: {prompt}\nassistant: {completion}" if chat else f"{prompt}{COMPLETION_MARK}{completion}"
        )
    return 0


def auto_profile(run_args: list[str], num_processes: int | None) -> tuple[str, str]:
    """The planner's pick for the model and batch the run flags (and their recipe) ask for."""
    from finetune.planner import choose_profile, run_workload, visible_gpu_memory_gib

    model_args, data_args, training_args = parse_run_flags(run_args)
    memory = visible_gpu_memory_gib()
    if memory is None:
        raise FinetuneError("--profile auto plans GPU memory, and no GPU is visible: name a profile")
    # torch_compile is None until the run applies its launch: planned per profile
    dtype = precision_on(training_args, torch.cuda.is_bf16_supported())
    shape, workload = run_workload(model_args, data_args, training_args, dtype)
    layout = ParallelLayout(num_processes or torch.cuda.device_count())
    return choose_profile(shape, workload, layout, memory)


def workload_of(options: argparse.Namespace, block_size: int) -> Workload:
    from finetune.memory_model import Workload

    compiled = {"true": True, "false": False}.get(options.torch_compile)
    # the adapter flags checked as run.py checks them
    adapters = ModelArguments(**{name: getattr(options, name) for name in PLAN_ADAPTER_FLAGS})
    return Workload(
        micro_batch=options.batch_size,
        block_size=block_size,
        dtype=options.precision,
        gradient_checkpointing=options.gradient_checkpointing,
        compiled=compiled,
        peft=adapters.peft,
        lora_rank=adapters.lora_rank,
        lora_dropout=adapters.lora_dropout,
    )


def plan_command(options: argparse.Namespace) -> int:
    from finetune.memory_model import DEFAULT_MARGIN, Calibration
    from finetune.planner import (
        LADDER_BLOCK_SIZE,
        Hardware,
        format_global_batch,
        format_largest,
        format_plan,
        largest_micro_batch,
        plan,
        recommend,
        shape_of,
        visible_gpu_memory_gib,
        what_would_fit,
    )

    memory = options.gpu_memory or visible_gpu_memory_gib()
    if memory is None:
        raise FinetuneError("no GPU is visible: pass --gpu_memory GIB")
    calibration = Calibration.measured()
    if options.margin is None:
        options.margin = DEFAULT_MARGIN
    layout = ParallelLayout(options.gpus)
    if options.largest:
        workload = workload_of(options, options.block_size or LADDER_BLOCK_SIZE)
        hardware = Hardware(layout, memory, options.host_memory, options.gpus_per_node, options.margin)
        print(format_largest(workload, hardware, calibration))
        return 0
    hardware = Hardware(layout, memory, gpus_per_node=options.gpus_per_node, margin=options.margin)
    shape, default_block = shape_of(options.model, options.config_overrides)
    workload = workload_of(options, options.block_size or default_block)
    profiles = options.profiles.split(",") if options.profiles else None
    estimates = plan(shape, workload, layout, calibration, profiles)
    print(format_plan(shape, workload, estimates, hardware))
    if options.picture is not None:
        from finetune.pictures import plan_picture

        title = (
            f"{shape.name}, micro batch {workload.micro_batch} x {workload.block_size}, {options.gpus} GPU(s)"
        )
        plan_picture(estimates, memory, options.margin, title, options.picture)
        print(f"picture: {options.picture}")
    if options.global_batch_size is not None:
        print()
        print(
            format_global_batch(shape, workload, estimates, hardware, calibration, options.global_batch_size)
        )
    best = recommend(estimates, memory, options.margin)
    if best is not None:
        largest = largest_micro_batch(best.strategy, shape, workload, hardware, calibration)
        print(f"largest micro batch predicted to fit with {best.profile}: {largest}")
        order = ", ".join(e.profile for e in estimates)
        print(f"recommended: {best.profile} (the first that fits, in the order {order})")
        return 0
    print("nothing fits; changes that would:")
    for change in what_would_fit(shape, workload, layout, memory, calibration, options.margin):
        print(f"  {change}")
    return 1


def compare_command(options: argparse.Namespace, run_args: list[str]) -> int:
    from finetune.arguments import expand_recipe
    from finetune.compare import compare, default_profiles, training_variants, variant_flags

    run_args = expand_recipe(run_args)  # every run's own flags are added around these
    variants = training_variants(options.variants, run_args)
    for variant in variants:
        parse_run_flags([*run_args, *variant_flags(variant)])
    profiles = options.profiles.split(",") if options.profiles else default_profiles(run_args)
    for name in profiles:
        load_profile(name)
    command_line = " ".join(["finetune", "compare", *sys.argv[2:]])
    rows = compare(
        profiles,
        Placement(num_processes=options.num_processes),
        run_args,
        Path(options.output_dir),
        options.timeout,
        command_line,
        **({"variants": tuple(variants)} if options.variants else {}),
    )
    print((Path(options.output_dir) / "comparison.md").read_text())
    return 0 if any(row.status == "completed" for row in rows) else 1


def slurm_command(options: argparse.Namespace, run_args: list[str]) -> int:
    from finetune.slurm import SlurmJob

    load_profile(options.profile)
    _, _, training_args = parse_run_flags(run_args, ("--output_dir", f"outputs/{options.job_name}"))
    job = SlurmJob(
        profile=options.profile,
        nodes=options.nodes,
        processes_per_node=options.processes_per_node or options.gpus_per_node,
        gpus_per_node=options.gpus_per_node,
        time=options.time,
        output_dir=training_args.output_dir,
        job_name=options.job_name,
        partition=options.partition,
        cpus_per_task=options.cpus_per_task,
        mem=options.mem,
        mem_per_gpu=options.mem_per_gpu,
        signal_seconds=options.signal_seconds,
        nccl_debug=options.nccl_debug,
        nccl_socket_ifname=options.nccl_socket_ifname,
        nccl_ib_disable=options.nccl_ib_disable,
        run_args=without_flag(run_args, "--output_dir"),  # the job passes its absolute output_dir
    )
    try:  # the script is all this writes: the job creates its output_dir
        Path(options.output).write_text(job.script())
    except OSError as error:
        raise FinetuneError(f"cannot write the script to {options.output}: {error.strerror}") from None
    print(f"finetune: wrote {options.output}; submit it with: sbatch {options.output}")
    return 0


def without_flag(run_args: list[str], flag: str) -> list[str]:
    """The run flags less every `flag VALUE` (or `flag=VALUE`), as argparse finds them."""
    finder = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    finder.add_argument(flag)
    return finder.parse_known_args(run_args)[1]


def add_slurm_parser(commands: argparse._SubParsersAction) -> None:
    slurm = commands.add_parser(
        "slurm",
        help="write an sbatch script: a profile on N nodes, checkpoint before the time limit, requeue",
        description="Flags not listed here go to every run (see `python -m finetune.run --help`).",
    )
    slurm.add_argument("--profile", required=True, help="profile name or YAML file")
    slurm.add_argument("--nodes", type=int, default=1)
    slurm.add_argument("--gpus_per_node", "--gpus-per-node", type=int, default=0)
    slurm.add_argument("--processes_per_node", type=int, help="ranks per node (default: --gpus_per_node)")
    slurm.add_argument("--time", default="04:00:00", help="time limit, as sbatch --time")
    slurm.add_argument("--partition")
    slurm.add_argument("--job_name", default="finetune")
    slurm.add_argument(
        "--cpus_per_task", type=int, help="CPUs for each node's task (default: 4 per rank on the node)"
    )
    memory = slurm.add_mutually_exclusive_group()
    memory.add_argument(
        "--mem", help="host memory per node, as sbatch --mem (default: 16G per rank on the node)"
    )
    memory.add_argument("--mem_per_gpu", help="host memory per GPU instead, as sbatch --mem-per-gpu")
    slurm.add_argument(
        "--signal_seconds", type=int, default=120, help="checkpoint this long before the limit"
    )
    slurm.add_argument("--nccl_debug", help="NCCL_DEBUG, e.g. INFO or WARN")
    slurm.add_argument("--nccl_socket_ifname", help="NCCL_SOCKET_IFNAME, e.g. ib0 or eth0")
    slurm.add_argument("--nccl_ib_disable", action="store_true", help="NCCL_IB_DISABLE=1 (no InfiniBand)")
    slurm.add_argument("--output", default="finetune.sbatch", help="where to write the script")


def names(strategies: list[Strategy]) -> str:
    return ", ".join(strategy.name for strategy in strategies)


def shipped_for_help() -> list[Strategy]:
    """The shipped strategies the help lists; none where a profile cannot be read (a broken
    ds_configs/ in the working directory), so that every command still parses and reports it."""
    try:
        return shipped_strategies()
    except FinetuneError:
        return []


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise ValueError(text)
    return value


positive_int.__name__ = "positive int"  # argparse names the type in its message: "invalid positive int value"
positive_float.__name__ = "positive number"
fraction.__name__ = "fraction (0 to below 1)"


PLAN_ADAPTER_FLAGS = ("peft", "lora_rank", "lora_dropout")
EVAL_DATA_FLAGS = ("dataset", "text_column", "data_format")


def add_plan_parser(commands: argparse._SubParsersAction) -> None:
    shipped = shipped_for_help()
    planning = commands.add_parser("plan", help="predict memory per GPU for every profile, and recommend one")
    planning.add_argument("--model", default="gpt2", help="name, GPT-2 alias or local folder (config only)")
    planning.add_argument("--config_overrides", help='change the shape: "n_layer=32,n_embd=4096,n_head=32"')
    planning.add_argument("--gpus", type=positive_int, default=1, help="GPUs in all")
    planning.add_argument(
        "--gpus_per_node", type=positive_int, help="GPUs per machine, for host RAM (default: --gpus)"
    )
    planning.add_argument(
        "--gpu_memory", type=positive_float, help="GiB per GPU (default: the visible GPU's)"
    )
    planning.add_argument("--batch_size", type=positive_int, default=8, help="micro batch per GPU")
    planning.add_argument(
        "--block_size", type=positive_int, help="tokens per sample (default: context, at most 1024)"
    )
    planning.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    planning.add_argument("--gradient_checkpointing", action="store_true")
    add_run_flags(planning, ModelArguments, PLAN_ADAPTER_FLAGS)  # planned as run.py trains them
    planning.add_argument(
        "--torch_compile",
        choices=["true", "false"],
        help="plan compiled or eager runs (default: as run.py does: "
        f"{names([s for s in shipped if s.compiled_by_default])} compiled, the rest eager)",
    )
    planning.add_argument(
        "--profiles",
        help="comma-separated profile names or YAML files (default: every profile that runs on --gpus, "
        f"fastest first: {names(shipped)})",
    )
    planning.add_argument(
        "--largest",
        action="store_true",
        help="instead: the largest GPT-style model each profile is predicted to fit (--model is ignored)",
    )
    planning.add_argument(
        "--host_memory", type=positive_float, help="GiB of host RAM per node, for --largest"
    )
    planning.add_argument(
        "--margin", type=fraction, help="share of GPU memory kept free (default: the planner's error, 0.15)"
    )
    planning.add_argument(
        "--picture",
        type=Path,
        help="also draw each profile's predicted memory, stacked by parameters, gradients, optimizer "
        "and activations, beside the GPU's memory, into this PNG",
    )
    planning.add_argument(
        "--global_batch_size",
        type=positive_int,
        help="also show the micro batch and accumulation `finetune run --global_batch_size` would choose "
        "under each profile",
    )


def add_compare_parser(commands: argparse._SubParsersAction) -> None:
    comparing = commands.add_parser(
        "compare",
        help="run several profiles on one model, one table",
        description="Flags not listed here go to every run, as to `finetune run`: --model, a recipe first, "
        "... (see `python -m finetune.run --help`).",
    )
    comparing.add_argument(
        "--profiles",
        help="comma-separated profile names or YAML files (default: every multi-process profile, fastest "
        "first; the NVMe one only with --nvme_path)",
    )
    comparing.add_argument("--num_processes", "--gpus", type=int, help="processes per run (default: GPUs)")
    comparing.add_argument(
        "--output_dir", default="outputs/compare", help="a new folder per run in it; earlier ones are kept"
    )
    comparing.add_argument("--timeout", type=float, default=1800, help="seconds before a run is stopped")
    comparing.add_argument(
        "--variants",
        help="training variants each profile runs in, comma-separated: full (every weight), lora, dora "
        "(as run.py's --peft); e.g. full,lora to answer full or LoRA, on which profile (default: as the "
        "run flags say)",
    )


def add_export_parser(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export", help="write a checkpoint of any profile as a plain Hugging Face model folder"
    )
    export.add_argument("checkpoint", help="a checkpoint-N folder (DDP, FSDP or DeepSpeed ZeRO)")
    export.add_argument("output_dir", help="folder for config.json, tokenizer and model.safetensors")
    export.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="weights dtype")
    export.add_argument(
        "--overwrite", action="store_true", help="export into a folder that already holds files"
    )
    export.add_argument(
        "--merge",
        action="store_true",
        help="a --peft run's checkpoint: merge the adapters into the base model and write a plain model "
        "(default: the adapter folder, for PeftModel.from_pretrained)",
    )
    export.add_argument(
        "--base_model",
        help="a --peft run's checkpoint: the base model to put its adapters on (default: the one its run "
        "recorded, an absolute path or a name)",
    )


def add_eval_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="perplexity of a saved model on a dataset split (sliding window); on instruction data the "
        "answer-only loss and, with --generate, exact match of generated answers",
    )
    evaluate.add_argument("model", help="a model folder (a run's output_dir, an export) or a name")
    add_run_flags(evaluate, DataArguments, EVAL_DATA_FLAGS)  # the data read as run.py reads it
    evaluate.add_argument("--split", default="validation", choices=["train", "validation", "test"])
    evaluate.add_argument(
        "--block_size",
        type=int,
        help="window length (default: the block size a run trained at, else the context)",
    )
    evaluate.add_argument("--stride", type=int, help="window step (default: the block size, no overlap)")
    evaluate.add_argument("--batch_size", type=int, default=8, help="windows per forward")
    evaluate.add_argument("--max_tokens", type=int, help="evaluate only the split's first N tokens")
    evaluate.add_argument(
        "--generate",
        action="store_true",
        help="instruction data: complete each prompt greedily and score exact match of the answers",
    )
    evaluate.add_argument(
        "--answer_pattern",
        help="regular expression that finds the answer in completion and reference, its first group if "
        "it has one (GSM8K: '#### (.+)'; default: the whole stripped text)",
    )
    evaluate.add_argument(
        "--max_new_tokens", type=int, help="tokens generated per prompt at most (default 256)"
    )
    evaluate.add_argument(
        "--max_examples", type=int, help="instruction data: evaluate only the split's first N examples"
    )
    evaluate.add_argument("--output", help="also write the result to this JSON file")
    evaluate.add_argument(
        "--completions",
        help="--generate: write every prompt, completion, answer and reference to this JSONL file "
        "(default: beside --output as RESULT.completions.jsonl, else eval-SPLIT.completions.jsonl in the "
        "model's folder)",
    )
    evaluate.add_argument(
        "--stop", action="append", default=[], help="--generate: text that ends an answer (repeat for more)"
    )


def add_generate_parser(commands: argparse._SubParsersAction) -> None:
    generation = commands.add_parser("generate", help="complete prompts with a saved model")
    generation.add_argument("model", help="a model folder (a run's output_dir, an export) or a name")
    generation.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for more)")
    generation.add_argument("--prompts_file", help="a file of prompts, one per line")
    generation.add_argument("--max_new_tokens", type=int, default=50)
    generation.add_argument("--temperature", type=float, default=1.0)
    generation.add_argument("--top_k", type=int, default=50)
    generation.add_argument("--top_p", type=float, default=1.0)
    generation.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    generation.add_argument("--seed", type=int, default=42, help="sampling seed (same seed, same text)")
    generation.add_argument(
        "--stop", action="append", default=[], help="text that ends a completion (repeat for more)"
    )
    generation.add_argument(
        "--chat",
        action="store_true",
        help="each prompt is a user's message, rendered by the chat template saved with the model",
    )
    generation.add_argument("--system", help="with --chat: a system message before each prompt")


def add_profiles_parser(commands: argparse._SubParsersAction) -> None:
    profiles = commands.add_parser("profiles", help="list the strategy profiles and validate them")
    profiles.add_argument(
        "files", nargs="*", help="profile YAML files to check (default: the shipped profiles)"
    )
    profiles.add_argument(
        "--copy",
        nargs=2,
        metavar=("NAME", "DIR"),
        help="write an editable copy of profile NAME (its YAML and DeepSpeed JSON) into DIR",
    )


def add_run_parser(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run",
        help="launch finetune/run.py under a profile with accelerate launch",
        description="Any flag not listed here goes to finetune/run.py (see `python -m finetune.run --help`). "
        "Run flags may start with a recipe, a YAML file of them (`finetune run --profile single "
        "recipes/cpu_quickstart.yaml`): a path, or, where no such file exists, the shipped recipe of that "
        "file name.",
    )
    run.add_argument(
        "--profile",
        required=True,
        help=f"profile name ({names(shipped_for_help())}: fastest first, see `finetune profiles`), "
        "YAML file, or auto (the planner's pick)",
    )
    add_placement_arguments(run)
    run.add_argument(
        "--doctor", action="store_true", help="run `finetune doctor` first; train only if every check passes"
    )


def add_doctor_parser(commands: argparse._SubParsersAction) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check the machine for a run on the ranks the run would start: GPUs, collectives, DeepSpeed "
        "build locks, disk, model and data names; one table, exit 0 only if all pass",
        description="Takes `finetune run`'s placement flags and run flags (or a recipe).",
    )
    doctor.add_argument("--profile", required=True, help="profile name or YAML file")
    add_placement_arguments(doctor)


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the ranks go (Placement): `finetune run`'s and `finetune doctor`'s, passed to accelerate."""
    parser.add_argument("--num_processes", type=int, help="processes in all (default: every visible GPU)")
    parser.add_argument("--num_machines", type=int, help="machines (nodes) taking part")
    parser.add_argument("--machine_rank", type=int, help="this machine's rank among them")
    parser.add_argument("--main_process_ip", help="address of machine rank 0")
    parser.add_argument("--main_process_port", type=int, help="port on machine rank 0")


@dataclass(frozen=True)
class Command:
    """A `finetune` command: the function that registers its parser and the one that runs it.

    A command that takes run flags gets what its own parser left (`run_args`) and reads it with
    finetune/run.py's parser; the others refuse any flag they do not declare.
    """

    register: Callable[[argparse._SubParsersAction], None]
    execute: Callable[..., int]
    takes_run_flags: bool = False


COMMANDS = {
    "profiles": Command(add_profiles_parser, profiles_command),
    "run": Command(add_run_parser, run_command, takes_run_flags=True),
    "compare": Command(add_compare_parser, compare_command, takes_run_flags=True),
    "slurm": Command(add_slurm_parser, slurm_command, takes_run_flags=True),
    "doctor": Command(add_doctor_parser, doctor_command, takes_run_flags=True),
    "plan": Command(add_plan_parser, plan_command),
    "export": Command(add_export_parser, export_command),
    "eval": Command(add_eval_parser, eval_command),
    "generate": Command(add_generate_parser, generate_command),
}


class CommandParser(OneLineArgumentErrors, argparse.ArgumentParser):
    """The `finetune` command and, through add_subparsers, each of its commands."""


def make_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="finetune", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    with exit_on_user_error():
        parser = make_parser()
        options, rest = parser.parse_known_args(argv)
        if rest[:1] == ["--"]:  # `finetune slurm ... -- <run flags>`: the separator is not a run flag
            rest = rest[1:]
        command = COMMANDS[options.command]
        if rest and not command.takes_run_flags:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        pin_data_dir()  # before any child environment is built from os.environ
        return command.execute(options, rest) if command.takes_run_flags else command.execute(options)
    return 0
