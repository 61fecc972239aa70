"""`finetune slurm`: an sbatch script for a profile on N nodes (finetune/slurm.py writes it)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from finetune.commands.shared import flags_into, parse_run_flags
from finetune.errors import FinetuneError
from finetune.profiles import load_profile


@dataclass
class SlurmFlags:
    profile: str = field(metadata={"help": "profile name or YAML file"})
    nodes: int = field(default=1, metadata={"help": "machines the job takes"})
    gpus_per_node: int = field(default=0, metadata={"help": "GPUs each node gives the job"})
    processes_per_node: int | None = field(
        default=None, metadata={"help": "ranks per node (default: --gpus_per_node)"}
    )
    time: str = field(default="04:00:00", metadata={"help": "time limit, as sbatch --time"})
    partition: str | None = field(default=None, metadata={"help": "sbatch --partition"})
    job_name: str = field(default="finetune", metadata={"help": "sbatch --job-name, and outputs/NAME"})
    cpus_per_task: int | None = field(
        default=None, metadata={"help": "CPUs for each node's task (default: 4 per rank on the node)"}
    )
    mem: str | None = field(
        default=None,
        metadata={"help": "host memory per node, as sbatch --mem (default: 16G per rank on the node)"},
    )
    mem_per_gpu: str | None = field(
        default=None, metadata={"help": "host memory per GPU instead of --mem, as sbatch --mem-per-gpu"}
    )
    signal_seconds: int = field(default=120, metadata={"help": "checkpoint this long before the limit"})
    nccl_debug: str | None = field(default=None, metadata={"help": "NCCL_DEBUG, e.g. INFO or WARN"})
    nccl_socket_ifname: str | None = field(
        default=None, metadata={"help": "NCCL_SOCKET_IFNAME, e.g. ib0 or eth0"}
    )
    nccl_ib_disable: bool = field(default=False, metadata={"help": "NCCL_IB_DISABLE=1 (no InfiniBand)"})
    output: str = field(default="finetune.sbatch", metadata={"help": "where to write the script"})
    overwrite: bool = field(
        default=False, metadata={"help": "replace an --output file that holds another script"}
    )

    def __post_init__(self) -> None:
        if self.mem is not None and self.mem_per_gpu is not None:
            raise FinetuneError("give --mem (per node) or --mem_per_gpu, not both")


def add_parser(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "slurm",
        help="write an sbatch script: a profile on N nodes, checkpoint before the time limit, requeue",
        description="Flags not listed here go to every run (see `python -m finetune.run --help`).",
        dataclass_types=[SlurmFlags],
    )


def execute(options: argparse.Namespace, run_args: list[str]) -> int:
    from finetune.slurm import SlurmJob

    flags_into(SlurmFlags, options)  # its checks, before anything is read
    load_profile(options.profile)
    _, _, training_args = parse_run_flags(run_args, ("--output_dir", f"outputs/{options.job_name}"))
    if training_args.save_only_model:
        raise FinetuneError(
            "--save_only_model: a requeued job resumes from its newest checkpoint, which would hold no "
            "optimizer, scheduler or data position to resume"
        )
    job = flags_into(
        SlurmJob,
        options,
        processes_per_node=options.processes_per_node or options.gpus_per_node,
        output_dir=training_args.output_dir,
        run_args=without_flag(run_args, "--output_dir"),  # the job passes its absolute output_dir
    )
    script, output = job.script(), Path(options.output)
    if not options.overwrite and output.is_file() and output.read_bytes() != script.encode():
        raise FinetuneError(
            f"{output} holds another script (one edited by hand, or another job's): pass --overwrite to "
            "replace it, or choose another --output"
        )
    try:  # the script is all this writes: the job creates its output_dir
        output.write_text(script)
    except OSError as error:
        raise FinetuneError(f"cannot write the script to {options.output}: {error.strerror}") from None
    print(f"finetune: wrote {options.output}; submit it with: sbatch {options.output}")
    return 0


def without_flag(run_args: list[str], flag: str) -> list[str]:
    """The run flags less every `flag VALUE` (or `flag=VALUE`), as argparse finds them."""
    finder = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    finder.add_argument(flag)
    return finder.parse_known_args(run_args)[1]
