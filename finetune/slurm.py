"""`finetune slurm`: an sbatch script that runs a profile on N nodes, survives time limits and requeues.

One task per node runs `finetune run` with that node's machine rank; machine 0's host and a port
derived from the job id are the rendezvous. SLURM signals the batch script (USR1, `--signal`
seconds before the limit); the script passes the signal to this job's training ranks on its node
(a signal that reaches one rank stops them all: finetune/checkpoint.py), they save a checkpoint and
exit 75, and the script requeues the job. Every start of the job runs with `--resume`, so the first
start trains from scratch and each requeue continues.

Writing the script touches nothing else: the job creates its output_dir, and it runs the `finetune`
of the environment it is submitted from, not a path of the machine that wrote it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from finetune.errors import RESUMABLE_EXIT_CODE, FinetuneError
from finetune.resolve import DATA_DIR_ENV, data_dir

WORKER_PATTERN = r"^[^ ]*python[^ ]* (-u )?[^ ]*finetune/run\.py"  # the ranks, not the launchers
CPUS_PER_RANK = 4
MEMORY_PER_RANK_GB = 16
CARRIED_ENVIRONMENT = ("HF_HUB_OFFLINE", "HF_HOME")
# Each value written into an `#SBATCH` line, as sbatch's manual gives its format. A value is never
# quoted there (sbatch reads the line's rest as it is), so anything else, a newline above all, is
# refused: after a newline the rest would run as a command, and sbatch stops reading directives at
# the first command, dropping the ones after it (the time limit, --requeue, --signal).
DIRECTIVE_FORMATS = {
    "time": (
        re.compile(
            r"(\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|unlimited|infinite)", re.IGNORECASE | re.ASCII
        ),
        "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
    ),
    "mem": (re.compile(r"\d+[KMGT]?", re.I | re.ASCII), "a number with an optional K, M, G or T, e.g. 64G"),
    "mem_per_gpu": (re.compile(r"\d+[KMGT]?", re.I | re.ASCII), "a number with an optional K, M, G or T"),
    "partition": (re.compile(r"[\w.-]+(,[\w.-]+)*", re.ASCII), "names of letters, digits, '_', '.', '-'"),
    "job_name": (re.compile(r"[\w.+-]{1,128}", re.ASCII), "up to 128 letters, digits, '_', '.', '+', '-'"),
    "nccl_debug": (re.compile(r"VERSION|WARN|INFO|TRACE", re.IGNORECASE), "VERSION, WARN, INFO or TRACE"),
    "nccl_socket_ifname": (
        re.compile(r"[\^=]?[\w.:-]+(,[\w.:-]+)*", re.ASCII),
        "interface names, e.g. ib0,eth0",
    ),
}
LATEST_SIGNAL_S = 65535  # sbatch's --signal: "sig_time must be an integer between 0 and 65535"


def limit_seconds(time: str) -> int | None:
    """sbatch's --time in seconds (None for unlimited): minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or
    D-HH:MM:SS, as its manual reads them; "a time limit of zero requests that no time limit be
    imposed"."""
    if time.lower() in ("unlimited", "infinite"):
        return None
    days, _, clock = time.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (*parts, 0, 0)[:3]
        total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    else:
        hours, minutes, seconds = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
        total = (hours * 60 + minutes) * 60 + seconds
    return total or None


COUNTS = {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "signal_seconds": 1}
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")
NODE_TASK = (
    'srun --ntasks-per-node=1 bash -c \'exec "$@" --machine_rank "$SLURM_NODEID"\' finetune "${run[@]}" &'
)


def finetune_command() -> tuple[list[str], str]:
    """How the job starts finetune, and a comment saying which environment that is.

    An installed entry point is called by name, so the job uses the environment active when it is
    submitted (sbatch passes it on); without one, `python -m finetune` needs finetune installed in
    the job's python, and the script says so rather than pointing at this machine's checkout.
    """
    entry_point = Path(sys.executable).parent / "finetune"
    # a path is only quoted in a comment: a newline in it would end the comment and run the rest
    shown_entry_point, shown_python = (
        CONTROL_CHARACTER.sub("?", str(path)) for path in (entry_point, sys.executable)
    )
    if entry_point.is_file() and shutil.which("finetune") == str(entry_point):
        return ["finetune"], (
            f"# Runs the `finetune` on the job's PATH (this script was written by {shown_entry_point}):\n"
            "# submit from a shell where that environment is active; sbatch passes it on."
        )
    return ["python", "-m", "finetune"], (
        f"# finetune was not an installed command where this was written (python: {shown_python}):\n"
        "# the job runs `python -m finetune`, so the job's python must have finetune installed (pip install)."
    )


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
    mem: str | None = None
    mem_per_gpu: str | None = None
    signal_seconds: int = 120
    nccl_debug: str | None = None
    nccl_socket_ifname: str | None = None
    nccl_ib_disable: bool = False
    run_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        """Every value the script writes is checked against its format: see DIRECTIVE_FORMATS."""
        if self.processes_per_node < 1:
            raise FinetuneError("give --gpus_per_node N (or --processes_per_node N for CPU ranks)")
        if self.gpus_per_node and self.processes_per_node > self.gpus_per_node:
            raise FinetuneError(
                f"--processes_per_node {self.processes_per_node} is more than the {self.gpus_per_node} GPUs "
                "a node gives: each rank takes a GPU of its own (NCCL refuses two ranks on one)"
            )
        for name, (pattern, expected) in DIRECTIVE_FORMATS.items():
            value = getattr(self, name)
            if value is not None and not pattern.fullmatch(value):
                raise FinetuneError(f"--{name} {value!r}: expected {expected}")
        for name, smallest in COUNTS.items():
            value = getattr(self, name)
            if value is not None and value < smallest:
                raise FinetuneError(f"--{name} {value}: must be at least {smallest}")
        if self.signal_seconds > LATEST_SIGNAL_S:
            raise FinetuneError(
                f"--signal_seconds {self.signal_seconds}: sbatch takes at most {LATEST_SIGNAL_S}"
            )
        limit = limit_seconds(self.time)
        if limit is not None and self.signal_seconds >= limit:
            raise FinetuneError(
                f"--signal_seconds {self.signal_seconds} is not less than --time {self.time} ({limit} s): "
                "the job would be told to checkpoint and requeue as it starts, every time"
            )
        for value in (self.profile, self.output_dir, *self.run_args):
            if CONTROL_CHARACTER.search(value):
                raise FinetuneError(
                    f"{value!r}: control characters (a newline, a tab) are refused in a job script"
                )

    def directives(self) -> list[str]:
        cpus = self.cpus_per_task or CPUS_PER_RANK * self.processes_per_node
        lines = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={cpus}",
            f"--time={self.time}",
            "--requeue",
            f"--signal=B:USR1@{self.signal_seconds}",
            "--output=%x-%j.out",  # in the submit directory, which exists: the job creates output_dir
            "--open-mode=append",
        ]
        if self.mem_per_gpu:
            lines.append(f"--mem-per-gpu={self.mem_per_gpu}")
        else:
            lines.append(f"--mem={self.mem or f'{MEMORY_PER_RANK_GB * self.processes_per_node}G'}")
        if self.gpus_per_node:
            lines.append(f"--gpus-per-node={self.gpus_per_node}")
        if self.partition:
            lines.append(f"--partition={self.partition}")
        return [f"#SBATCH {line}" for line in lines]

    def environment(self) -> list[str]:
        """What the job needs from the writer's environment, in case the site does not pass it on."""
        lines = [
            'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        ]
        root = data_dir()
        if root is not None:
            lines.append(f"export {DATA_DIR_ENV}={shlex.quote(str(root))}")
        for name in CARRIED_ENVIRONMENT:
            if os.environ.get(name):
                lines.append(f"export {name}={shlex.quote(os.environ[name])}")
        if self.nccl_debug:
            lines.append(f"export NCCL_DEBUG={shlex.quote(self.nccl_debug)}")
        if self.nccl_socket_ifname:
            lines.append(f"export NCCL_SOCKET_IFNAME={shlex.quote(self.nccl_socket_ifname)}")
        if self.nccl_ib_disable:
            lines.append("export NCCL_IB_DISABLE=1")
        return lines

    def run_array(self, finetune: list[str]) -> str:
        """The run's command line as a bash array: the rendezvous variables expanded, every argument
        of the run single-quoted so that nothing in it is."""
        head = [*finetune, "run", "--profile", self.profile, "--num_processes",
                str(self.nodes * self.processes_per_node), "--num_machines", str(self.nodes)]  # fmt: skip
        rest = [*self.run_args, "--output_dir", os.path.abspath(self.output_dir), "--resume"]
        rendezvous = '--main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT"'
        return f"run=({shlex.join(head)} {rendezvous} {shlex.join(rest)})"

    def script(self) -> str:
        finetune, which = finetune_command()
        return "\n".join(
            [
                "#!/bin/bash",
                *self.directives(),
                "# Written by `finetune slurm`; submit with sbatch.",
                which,
                "set -u",
                f"command -v {finetune[0]} > /dev/null || {{ echo 'finetune: error: no {finetune[0]} on the "
                "PATH of the job (see the comment above)' >&2; exit 2; }",
                *self.environment(),
                "",
                "# Before the time limit SLURM sends USR1 here: pass it to this job's ranks on this node",
                "# (scontrol listpids: this job's processes only); they save a checkpoint and exit 75.",
                "stop_with_a_checkpoint() {",
                "    local pid",
                "    for pid in $(scontrol listpids \"$SLURM_JOB_ID\" | awk 'NR > 1 {print $1}'); do",
                f'        if ps -o args= -p "$pid" | grep -Eq {shlex.quote(WORKER_PATTERN)}; then',
                '            kill -USR1 "$pid"',
                "        fi",
                "    done",
                "}",
                "trap stop_with_a_checkpoint USR1",
                "",
                self.run_array(finetune),
                "# Each node's task adds its own $SLURM_NODEID: the run's arguments are passed to bash as",
                "# arguments, never inside the command string, so nothing in them is expanded.",
                NODE_TASK,
                "pid=$!",
                "while :; do  # a trapped signal interrupts the wait while the ranks go on",
                '    wait "$pid"; status=$?',
                '    kill -0 "$pid" 2> /dev/null || break',
                "done",
                "",
                f"# Stopped with a checkpoint (exit {RESUMABLE_EXIT_CODE}): requeue; the next start resumes.",
                "# Any other end is final: a requeue after bad input would fail the same way, forever.",
                f'if [ "$status" -eq {RESUMABLE_EXIT_CODE} ]; then',
                '    scontrol requeue "$SLURM_JOB_ID"',
                "fi",
                'exit "$status"',
                "",
            ]
        )
