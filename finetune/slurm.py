"""`finetune slurm`: an sbatch script that runs a profile on N nodes, survives time limits and requeues.

One task per node runs `finetune run` with that node's machine rank; machine 0's host and a port
derived from the job id are the rendezvous. SLURM signals the batch script (USR1, `--signal`
seconds before the limit); the script passes the signal to the training ranks, which save a
checkpoint and exit 75 (finetune/checkpoint.py), and the script requeues the job. Every start of
the job runs with `--resume`, so the first start trains from scratch and each requeue continues.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from finetune.profiles import PROJECT_ROOT

WORKER_PATTERN = r"python[^ ]* (-u )?[^ ]*finetune/run\.py"  # the ranks, not the launchers


@dataclass
class SlurmJob:
    profile: str
    nodes: int
    processes_per_node: int
    gpus_per_node: int
    time: str
    output_dir: str
    job_name: str = "finetune"
    partition: str | None = None
    cpus_per_task: int | None = None
    signal_seconds: int = 120
    nccl_debug: str | None = None
    nccl_socket_ifname: str | None = None
    nccl_ib_disable: bool = False
    run_args: list[str] = field(default_factory=list)

    def directives(self) -> list[str]:
        lines = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            f"--time={self.time}",
            "--requeue",
            f"--signal=B:USR1@{self.signal_seconds}",
            f"--output={Path(self.output_dir).resolve()}/slurm-%j.out",
            "--open-mode=append",
        ]
        if self.gpus_per_node:
            lines.append(f"--gpus-per-node={self.gpus_per_node}")
        if self.cpus_per_task:
            lines.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.partition:
            lines.append(f"--partition={self.partition}")
        return [f"#SBATCH {line}" for line in lines]

    def environment(self) -> list[str]:
        lines = [
            'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        ]
        if self.nccl_debug:
            lines.append(f"export NCCL_DEBUG={shlex.quote(self.nccl_debug)}")
        if self.nccl_socket_ifname:
            lines.append(f"export NCCL_SOCKET_IFNAME={shlex.quote(self.nccl_socket_ifname)}")
        if self.nccl_ib_disable:
            lines.append("export NCCL_IB_DISABLE=1")
        return lines

    def launch(self) -> str:
        """One `finetune run` per node; $SLURM_NODEID (escaped) is expanded on each node, not here."""
        output_dir = str(Path(self.output_dir).resolve())
        run = [
            sys.executable, "-m", "finetune", "run", "--profile", self.profile,
            "--num_processes", str(self.nodes * self.processes_per_node), "--num_machines", str(self.nodes),
            "--main_process_ip", "$MASTER_ADDR", "--main_process_port", "$MASTER_PORT",
            *self.run_args, "--output_dir", output_dir, "--resume",
        ]  # fmt: skip
        quoted = " ".join(arg if arg.startswith("$") else shlex.quote(arg) for arg in run)
        return f'srun --ntasks-per-node=1 bash -c "{quoted} --machine_rank \\$SLURM_NODEID" &'

    def script(self) -> str:
        summary = shlex.quote(str(Path(self.output_dir).resolve() / "run_summary.json"))
        return "\n".join(
            [
                "#!/bin/bash",
                *self.directives(),
                "# Written by `finetune slurm`; submit with sbatch.",
                "set -u",
                f"cd {shlex.quote(str(PROJECT_ROOT))}",
                *self.environment(),
                "",
                "# Before the time limit SLURM sends USR1 here: pass it to the ranks; they save, exit 75.",
                "stop_with_a_checkpoint() {",
                f"    srun --overlap --ntasks-per-node=1 pkill -USR1 -f {shlex.quote(WORKER_PATTERN)}",
                "}",
                "trap stop_with_a_checkpoint USR1",
                "",
                self.launch(),
                "wait $! || wait $!  # a trapped signal interrupts the first wait",
                "",
                "# Stopped with a checkpoint: requeue; the next start resumes from it.",
                f'if grep -q \'"status": "interrupted"\' {summary}; then',
                '    scontrol requeue "$SLURM_JOB_ID"',
                "fi",
                "",
            ]
        )
