"""finetune slurm: the script's contents, and a real one-machine SLURM cluster running it.

The cluster (munge + slurmctld + slurmd, Debian's slurm-wlm) is installed by .ci/run and started
here; where it is not installed or this is not root, the cluster tests skip and say why. A machine
that already has a SLURM configuration is left alone (skipped).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from finetune.cli import main as cli_main

from launching import ENVIRONMENT, PROJECT_ROOT, TINY_MODEL

SLURM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "ClusterName=finetune-ci"
HOSTILE_PROMPT = "Say $(touch {marker}) and `touch {marker}` for $5 'quoted' \"too\""
JOB_SIZE = {"processes_per_node": "2", "cpus_per_task": "2", "mem": "1G", "time": "00:10:00"}
RUN_FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "64", "--batch_size", "4",
    "--max_eval_samples", "8", "--disable_tqdm", "true", "--report_to", "none",
]  # fmt: skip


def write_script(tmp_path: Path, output_dir: Path, *flags: str, **options: str) -> Path:
    script = tmp_path / "job.sbatch"
    arguments = ["slurm", "--profile", "ddp", "--output", str(script), "--output_dir", str(output_dir)]
    for name, value in options.items():
        arguments += [f"--{name}", value]
    assert cli_main([*arguments, *flags]) == 0
    return script


def test_script_asks_for_the_nodes_gpus_time_and_requeue(tmp_path):
    text = write_script(tmp_path, tmp_path / "out", nodes="2", gpus_per_node="4", time="04:00:00").read_text()
    for directive in (
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=4",
        "--time=04:00:00",
        "--requeue",
    ):
        assert f"#SBATCH {directive}\n" in text
    assert "#SBATCH --signal=B:USR1@120" in text
    assert "--num_processes 8 --num_machines 2" in text
    assert '--machine_rank "$SLURM_NODEID"' in text
    assert 'if [ "$status" -eq 75 ]; then\n    scontrol requeue "$SLURM_JOB_ID"\nfi\nexit "$status"' in text


def test_script_sets_the_nccl_options_asked_for(tmp_path):
    script = write_script(tmp_path, tmp_path / "out", "--nccl_ib_disable", nodes="2", gpus_per_node="8",
                          nccl_debug="INFO", nccl_socket_ifname="eth0")  # fmt: skip
    text = script.read_text()
    assert "export NCCL_DEBUG=INFO" in text
    assert "export NCCL_SOCKET_IFNAME=eth0" in text
    assert "export NCCL_IB_DISABLE=1" in text
    assert "MASTER_ADDR=" in text


def test_run_flags_may_follow_a_double_dash(tmp_path):
    script = tmp_path / "job.sbatch"
    assert cli_main(["slurm", "--profile", "ddp", "--gpus_per_node", "1", "--output", str(script),
                     "--", "--model", "gpt2-medium", "--output_dir", str(tmp_path / "out")]) == 0  # fmt: skip
    text = script.read_text()
    assert " -- " not in text
    assert f"--model gpt2-medium --output_dir {tmp_path / 'out'} --resume)" in text


def test_every_start_resumes(tmp_path):
    assert "--resume)\n" in write_script(tmp_path, tmp_path / "out", gpus_per_node="1").read_text()


def test_writing_the_script_creates_nothing_but_the_script(tmp_path):
    write_script(tmp_path, tmp_path / "out", gpus_per_node="1")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.sbatch"]


def refused(script: Path, *flags: str) -> None:
    """`finetune slurm` writing `script` with `flags` stops with exit code 2."""
    with pytest.raises(SystemExit) as stop:
        cli_main(["slurm", "--profile", "ddp", "--gpus_per_node", "1", "--output", str(script), *flags])
    assert stop.value.code == 2


def test_script_that_cannot_be_written_is_one_line(tmp_path, capsys):
    refused(tmp_path / "no" / "job")
    assert (
        capsys.readouterr().err
        == f"finetune: error: cannot write the script to {tmp_path}/no/job: No such file or directory\n"
    )


def test_script_names_no_path_of_the_checkout(tmp_path):
    text = write_script(tmp_path, tmp_path / "out", gpus_per_node="1").read_text()
    commands = [line for line in text.splitlines() if not line.startswith("#")]
    assert not [line for line in commands if str(PROJECT_ROOT) in line or line.startswith("cd ")]
    assert "run=(finetune run --profile ddp " in text


def test_script_asks_for_cpus_and_memory_per_rank_by_default(tmp_path):
    text = write_script(tmp_path, tmp_path / "out", nodes="2", gpus_per_node="4").read_text()
    assert "#SBATCH --cpus-per-task=16\n" in text
    assert "#SBATCH --mem=64G\n" in text


def test_script_asks_for_the_cpus_and_memory_given(tmp_path):
    text = write_script(tmp_path, tmp_path / "out", gpus_per_node="4", cpus_per_task="32", mem_per_gpu="80G")
    assert "#SBATCH --cpus-per-task=32\n" in text.read_text()
    assert "#SBATCH --mem-per-gpu=80G\n" in text.read_text()
    assert "#SBATCH --mem=" not in text.read_text()


def test_script_carries_an_absolute_data_dir_and_the_hub_settings(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("FINETUNE_DATA_DIR", os.path.relpath(data_dir, tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf home"))
    text = write_script(tmp_path, tmp_path / "out", gpus_per_node="1").read_text()
    assert f"export FINETUNE_DATA_DIR={data_dir}\n" in text
    assert "export HF_HUB_OFFLINE=1\n" in text
    assert f"export HF_HOME='{tmp_path}/hf home'\n" in text


def test_run_arguments_reach_the_run_literally(tmp_path):
    prompt = HOSTILE_PROMPT.format(marker=tmp_path / "X")
    text = write_script(
        tmp_path, tmp_path / "out", "--generation_prompt", prompt, gpus_per_node="1"
    ).read_text()
    array = next(line for line in text.splitlines() if line.startswith("run=("))
    rendezvous = {**ENVIRONMENT, "MASTER_ADDR": "node0", "MASTER_PORT": "1"}
    printed = subprocess.run(["bash", "-c", f'{array}\nprintf "%s\\0" "${{run[@]}}"'], capture_output=True,
                             text=True, check=True, env=rendezvous)  # fmt: skip
    arguments = printed.stdout.split("\0")[:-1]
    assert arguments[arguments.index("--generation_prompt") + 1] == prompt
    assert arguments[arguments.index("--main_process_ip") + 1] == "node0"
    assert not (tmp_path / "X").exists()


def test_stop_signals_only_this_jobs_ranks(tmp_path):
    text = write_script(tmp_path, tmp_path / "out", gpus_per_node="1").read_text()
    assert "pkill" not in text
    assert 'scontrol listpids "$SLURM_JOB_ID"' in text


# A real SLURM


def running(name: str) -> bool:
    return subprocess.run(["pgrep", "-x", name], capture_output=True).returncode == 0


def start_cluster() -> None:
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(1024))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    if not running("munged"):
        subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
    for folder in ("/var/spool/slurmctld", "/var/spool/slurmd", "/var/log/slurm"):
        Path(folder).mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SLURM_CONF.write_text(
        f"{MARKER}\nSlurmctldHost={host}\nSlurmUser=root\nAuthType=auth/munge\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n"
        "SelectTypeParameters=CR_Core\nStateSaveLocation=/var/spool/slurmctld\nSlurmdSpoolDir=/var/spool/slurmd\n"
        "ReturnToService=2\nAccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
        "MpiDefault=none\nSlurmctldLogFile=/var/log/slurm/slurmctld.log\nSlurmdLogFile=/var/log/slurm/slurmd.log\n"
        f"NodeName={host} CPUs={os.cpu_count()} RealMemory={memory_mb} State=UNKNOWN\n"
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
    )
    for daemon in ("slurmctld", "slurmd"):
        if not running(daemon):
            subprocess.run([daemon], check=True)


@pytest.fixture(scope="module")
def slurm_cluster():
    if os.geteuid() != 0 or not all(
        shutil.which(tool) for tool in ("sbatch", "slurmctld", "slurmd", "munged")
    ):
        pytest.skip("SLURM is not installed here (.ci/run installs slurm-wlm and munge as root)")
    if SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text():
        pytest.skip(f"{SLURM_CONF} belongs to another cluster; not touching it")
    start_cluster()
    deadline = time.monotonic() + 60
    while "idle" not in node_state():
        assert time.monotonic() < deadline, "the SLURM node did not become idle"
        time.sleep(1)


def submit(script: Path) -> str:
    result = subprocess.run(["sbatch", "--parsable", str(script)], env=ENVIRONMENT, cwd=script.parent,
                            capture_output=True, text=True, check=True)  # fmt: skip
    return result.stdout.strip().split(";")[0]


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def summary_status(output_dir: Path) -> str | None:
    try:
        return json.loads((output_dir / "run_summary.json").read_text())["status"]
    except (OSError, json.JSONDecodeError):
        return None


def node_state() -> str:
    return subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout.strip()


def job_state(job: str) -> str:
    result = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    return next(
        (word.split("=")[1] for word in result.stdout.split() if word.startswith("JobState=")), "GONE"
    )


@pytest.fixture(scope="module")
def finished_job(slurm_cluster, tmp_path_factory) -> tuple[Path, str, Path]:
    """One generated job run to its end: its output_dir, its generation prompt (shell syntax that a
    script passing arguments through `bash -c` would run) and the marker that running it would create."""
    folder = tmp_path_factory.mktemp("slurm-job")
    output_dir, marker = folder / "out", folder / "X"
    prompt = HOSTILE_PROMPT.format(marker=marker)
    flags = [*RUN_FLAGS, "--max_steps", "8", "--generation_prompt", prompt]
    submit(write_script(folder, output_dir, *flags, **JOB_SIZE))
    wait_for(lambda: summary_status(output_dir) == "completed", 600, "the job to complete")
    return output_dir, prompt, marker


@pytest.mark.integration
def test_generated_job_trains_on_slurm(finished_job):
    output_dir, _, _ = finished_job
    summary = json.loads((output_dir / "run_summary.json").read_text())
    assert (summary["world_size"], summary["steps"]) == (2, 8)


@pytest.mark.integration
def test_job_passes_shell_syntax_in_run_arguments_to_the_run_literally(finished_job):
    output_dir, prompt, marker = finished_job
    summary = json.loads((output_dir / "run_summary.json").read_text())
    assert [generation["prompt"] for generation in summary["generations"]] == [prompt]
    assert not marker.exists()


@pytest.mark.integration
def test_signalled_job_saves_requeues_and_resumes(slurm_cluster, tmp_path):
    output_dir = tmp_path / "out"
    flags = [*RUN_FLAGS, "--max_steps", "80", "--save_steps", "10"]
    job = submit(write_script(tmp_path, output_dir, *flags, **JOB_SIZE))
    wait_for(
        lambda: (output_dir / "checkpoint-10" / "finetune_checkpoint.json").exists(), 600, "a checkpoint"
    )
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)  # what --signal sends
    wait_for(lambda: summary_status(output_dir) == "interrupted", 300, "the stop with a checkpoint")
    stopped = json.loads((output_dir / "run_summary.json").read_text())
    wait_for(lambda: job_state(job) == "PENDING", 120, "the requeue")
    # Skip SLURM's requeue delay, but not the clean-up of the first start: a start in the same second
    # as the requeue is refused ("job credential revoked").
    wait_for(lambda: node_state() == "idle", 120, "the node to be released")
    time.sleep(3)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
    wait_for(lambda: summary_status(output_dir) == "completed", 600, "the resumed job to complete")
    resumed = json.loads((output_dir / "run_summary.json").read_text())
    assert resumed["resumed_from_step"] == stopped["steps"]
    assert resumed["steps"] == 80


@pytest.mark.integration
def test_a_job_that_ends_on_bad_input_is_not_requeued(slurm_cluster, tmp_path):
    """Only the resumable exit requeues: the summary an earlier stop left says "interrupted", and a
    requeue decided from it would fail on the same bad input forever."""
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "run_summary.json").write_text(json.dumps({"status": "interrupted"}))
    flags = [*RUN_FLAGS, "--max_steps", "2", "--dataset", "no-such-dataset"]  # only the run finds out
    job = submit(write_script(tmp_path, output_dir, *flags, **JOB_SIZE))
    wait_for(lambda: job_state(job) in ("FAILED", "COMPLETED", "GONE"), 300, "the job to end")
    assert job_state(job) == "FAILED"
    log = next(tmp_path.glob("*.out")).read_text()
    assert "finetune: error: dataset 'no-such-dataset' not found" in log


HOSTILE_VALUES = {
    "time": "04:00:00\ntouch {marker}",
    "mem": "16G\ntouch {marker}",
    "mem_per_gpu": "8G touch",
    "partition": "gpu\ntouch {marker}",
    "job_name": "name\ntouch {marker}",
    "nccl_debug": "INFO\ntouch {marker}",
    "nccl_socket_ifname": "eth0\ntouch {marker}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_VALUES))
def test_a_value_outside_its_sbatch_format_is_refused_in_one_line(name, tmp_path, capsys):
    marker = tmp_path / "ran"
    script = tmp_path / "job.sbatch"
    refused(script, f"--{name}", HOSTILE_VALUES[name].format(marker=marker))
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and error.startswith(f"finetune: error: --{name} ")
    assert not script.exists()


FULLWIDTH_12, ARABIC_INDIC_16, FULLWIDTH_8 = "\uff11\uff12", "\u0661\u0666", "\uff18"


@pytest.mark.parametrize(
    ("name", "value"),
    [("time", FULLWIDTH_12), ("mem", f"{ARABIC_INDIC_16}G"), ("mem_per_gpu", f"{FULLWIDTH_8}G")],
)
def test_digits_of_other_scripts_are_refused(name, value, tmp_path, capsys):
    """sbatch reads ASCII digits only: `\\d` in Python matches every script's digits."""
    refused(tmp_path / "job.sbatch", f"--{name}", value)
    assert capsys.readouterr().err.startswith(f"finetune: error: --{name} ")


def test_a_newline_in_the_interpreters_path_stays_inside_the_scripts_comment(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.executable", f"/opt/env\ntouch {tmp_path / 'ran'}\n/bin/python")
    script = write_script(tmp_path, tmp_path / "out", gpus_per_node="1").read_text()
    assert not [line for line in script.splitlines() if line.startswith("touch")]


def test_a_newline_in_a_run_flag_is_refused(tmp_path, capsys):
    script = tmp_path / "job.sbatch"
    refused(script, "--run_name", "a\ntouch x")
    assert "control characters" in capsys.readouterr().err
    assert not script.exists()


@pytest.mark.parametrize(
    "time", ["30", "30:00", "4:00:00", "2-12", "2-12:30", "2-12:30:00", "UNLIMITED", "0", "0:00:00"]
)  # sbatch: "a time limit of zero requests that no time limit be imposed"
def test_every_sbatch_time_format_is_accepted(time, tmp_path):
    assert (
        f"#SBATCH --time={time}\n"
        in write_script(tmp_path, tmp_path / "out", gpus_per_node="1", time=time).read_text()
    )


@pytest.mark.parametrize(
    ("time", "signal_seconds", "expected"),
    [("2", "120", "is not less than --time 2 (120 s): the job would be told to checkpoint"),
     ("1-00:00:00", "120000", "sbatch takes at most 65535")],
)  # fmt: skip
def test_a_signal_sbatch_cannot_send_before_the_limit_is_refused(
    time, signal_seconds, expected, tmp_path, capsys
):
    script = tmp_path / "job.sbatch"
    refused(script, "--time", time, "--signal_seconds", signal_seconds)
    assert expected in capsys.readouterr().err
    assert not script.exists()


def test_the_directive_block_runs_nothing_and_every_directive_comes_before_the_first_command(tmp_path):
    """sbatch reads `#SBATCH` lines until the first command; bash runs the block as comments."""
    marker = tmp_path / "ran"
    options = {"gpus_per_node": "2", "nodes": "2", "partition": "gpu,debug", "job_name": "my-job.v2",
               "mem": "64G", "nccl_debug": "WARN", "nccl_socket_ifname": "^lo,docker"}  # fmt: skip
    text = write_script(tmp_path, tmp_path / "out", **options).read_text()
    lines = text.splitlines()[1:]
    block = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    assert len([line for line in lines if line.startswith("#SBATCH")]) == len(
        [line for line in block if line.startswith("#SBATCH")]
    )
    assert {"--partition=gpu,debug", "--job-name=my-job.v2", "--mem=64G"} <= {line[8:] for line in block}
    result = subprocess.run(["bash", "-c", "\n".join(block) + f"\n[ -e {marker} ] && echo ran"],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 1 and result.stdout == "" and not marker.exists()


def test_a_script_edited_by_hand_is_not_replaced_without_overwrite(tmp_path, capsys):
    script = write_script(tmp_path, tmp_path / "run", *RUN_FLAGS, gpus_per_node="1")
    assert write_script(tmp_path, tmp_path / "run", *RUN_FLAGS, gpus_per_node="1") == script  # the same: kept
    script.write_text(script.read_text() + "# the partition our admins want\n")
    edited = script.read_text()
    refused(script, "--output_dir", str(tmp_path / "run"), *RUN_FLAGS)
    assert "holds another script" in capsys.readouterr().err
    assert script.read_text() == edited
    write_script(tmp_path, tmp_path / "run", *RUN_FLAGS, "--overwrite", gpus_per_node="1")
    assert script.read_text() != edited


def test_more_ranks_per_node_than_gpus_are_refused_in_one_line(tmp_path, capsys):
    refused(tmp_path / "job.sbatch", "--gpus_per_node", "2", "--processes_per_node", "3")
    assert "--processes_per_node 3 is more than the 2 GPUs a node gives" in capsys.readouterr().err


def test_save_only_model_which_leaves_a_requeued_job_nothing_to_resume_is_refused(tmp_path, capsys):
    script = tmp_path / "job.sbatch"
    refused(script, "--gpus_per_node", "1", "--save_only_model")
    assert "--save_only_model: a requeued job resumes from its newest checkpoint" in capsys.readouterr().err
    assert not script.exists()


def test_memory_per_node_and_per_gpu_together_are_refused_in_one_line(tmp_path, capsys):
    script = tmp_path / "job.sbatch"
    refused(script, "--gpus_per_node", "1", "--mem", "16G", "--mem_per_gpu", "8G")
    error = capsys.readouterr().err.strip()
    assert error == "finetune: error: give --mem (per node) or --mem_per_gpu, not both"
    assert not script.exists()
