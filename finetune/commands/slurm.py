"""`finetune slurm`: an sbatch script for a profile on N nodes (finetune/slurm.py writes it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from finetune.commands.shared import flags_into, parse_run_flags
from finetune.errors import FinetuneError
from finetune.profiles import load_profile


def add_parser(commands: argparse._SubParsersAction) -> None:
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


def execute(options: argparse.Namespace, run_args: list[str]) -> int:
    from finetune.slurm import SlurmJob

    load_profile(options.profile)
    _, _, training_args = parse_run_flags(run_args, ("--output_dir", f"outputs/{options.job_name}"))
    job = flags_into(
        SlurmJob,
        options,
        processes_per_node=options.processes_per_node or options.gpus_per_node,
        output_dir=training_args.output_dir,
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
