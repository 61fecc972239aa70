"""The launcher wrapper (finetune/launch.py) around `accelerate launch`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import accelerate.commands.launch
import pytest
import yaml

from finetune.launch import DEEPSPEED_ENV_FILE_VARIABLE, run_launcher

from launching import ENVIRONMENT, FREE_PORT, LAUNCH_TIMEOUT_S, PROJECT_ROOT


def test_deepspeeds_multinode_environment_file_goes_to_a_private_folder_removed_after(monkeypatch, tmp_path):
    """accelerate's DeepSpeed multi-node branch appends the shell's environment to DeepSpeed's
    environment file; the fake launch below writes it exactly as accelerate does."""
    written = []

    def multinode_deepspeed_launch(args):
        from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME

        with open(DEEPSPEED_ENVIRONMENT_NAME, "a") as stream:
            stream.write("HF_TOKEN=secret\n")
        written.append((Path(DEEPSPEED_ENVIRONMENT_NAME), os.environ[DEEPSPEED_ENV_FILE_VARIABLE]))

    monkeypatch.setattr(accelerate.commands.launch, "launch_command", multinode_deepspeed_launch)
    config = PROJECT_ROOT / "accelerate_configs" / "zero3.yaml"
    assert run_launcher(["--config_file", str(config), "--num_machines", "2", "script.py"]) == 0
    [(path, variable)] = written
    assert path.is_absolute() and str(path) == variable  # the runner a launcher starts reads the same
    assert not path.exists(), "the private folder outlives the launch"
    assert not (tmp_path / ".deepspeed_env").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_the_printed_launch_command_names_a_profile_copy_that_outlives_the_run(tmp_path):
    """Kept in output_dir/.launch/ with its DeepSpeed JSON absolute: the line runs again as printed."""
    import subprocess
    import sys

    import yaml

    from launching import ENVIRONMENT, LAUNCH_TIMEOUT_S, TINY_MODEL

    output_dir = tmp_path / "out"
    command = [sys.executable, "-m", "finetune", "run", "--profile", "zero2", "--num_processes", "2",
               *TINY_MODEL, "--block_size", "32", "--max_steps", "1", "--max_eval_samples", "4",
               "--report_to", "none", "--output_dir", str(output_dir)]  # fmt: skip
    result = subprocess.run(command, cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True,
                            timeout=LAUNCH_TIMEOUT_S)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    printed = next(line for line in result.stderr.splitlines() if "--config_file" in line)
    config = Path(printed.split("--config_file ")[1].split()[0])
    assert config == output_dir / ".launch" / "zero2.yaml" and config.is_file()
    assert Path(yaml.safe_load(config.read_text())["deepspeed_config"]["deepspeed_config_file"]).is_absolute()


def test_a_deepspeed_profiles_compile_settings_reach_the_ranks(monkeypatch, tmp_path):
    """accelerate launch drops a DeepSpeed profile's dynamo_config; the ranks read it as variables."""
    seen = {}

    def deepspeed_launch(args):
        seen["regional"] = os.environ.get("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION")
        seen["mode"] = os.environ.get("ACCELERATE_DYNAMO_MODE")

    monkeypatch.setattr(accelerate.commands.launch, "launch_command", deepspeed_launch)
    monkeypatch.delenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", raising=False)
    monkeypatch.delenv("ACCELERATE_DYNAMO_MODE", raising=False)
    settings = yaml.safe_load((PROJECT_ROOT / "accelerate_configs" / "zero2.yaml").read_text())
    settings["deepspeed_config"]["deepspeed_config_file"] = str(PROJECT_ROOT / "ds_configs" / "zero2.json")
    settings["dynamo_config"] = {"dynamo_use_regional_compilation": True, "dynamo_mode": "max-autotune"}
    config = tmp_path / "zero2-blocks.yaml"
    config.write_text(yaml.safe_dump(settings))
    assert run_launcher(["--config_file", str(config), "--num_processes", "2", "script.py"]) == 0
    assert seen == {"regional": "True", "mode": "max-autotune"}
    assert "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION" not in os.environ  # for the launch alone


def test_a_deepspeed_profile_without_compile_settings_sets_none(monkeypatch):
    seen = {}

    def deepspeed_launch(args):
        seen.update(
            {name: value for name, value in os.environ.items() if name.startswith("ACCELERATE_DYNAMO")}
        )

    monkeypatch.setattr(accelerate.commands.launch, "launch_command", deepspeed_launch)
    for name in [name for name in os.environ if name.startswith("ACCELERATE_DYNAMO")]:
        monkeypatch.delenv(name)
    config = PROJECT_ROOT / "accelerate_configs" / "zero2_offload.yaml"
    assert run_launcher(["--config_file", str(config), "--num_processes", "2", "script.py"]) == 0
    assert seen == {}


KILLED_RANK = """
import os, signal
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rank_killed_outright_is_named_with_its_signal_and_the_likely_cause(tmp_path):
    script = tmp_path / "killed_rank.py"
    script.write_text(KILLED_RANK)
    ended = subprocess.run(
        [sys.executable, "-m", "finetune.launch", "--config_file", "accelerate_configs/ddp.yaml",
         "--num_processes", "2", "--main_process_port", str(FREE_PORT), str(script)],
        cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert ended.returncode == 137
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("finetune: rank 1 stopped with exit code 137 (SIGKILL: out of host memory")


def test_a_single_process_killed_outright_is_named_with_its_signal_and_the_likely_cause(tmp_path):
    """One process runs as accelerate's plain subprocess, which reports a signal as a negative code."""
    script = tmp_path / "killed.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    ended = subprocess.run(
        [sys.executable, "-m", "finetune.launch", "--config_file", "accelerate_configs/single.yaml",
         str(script)],
        cwd=PROJECT_ROOT, env=ENVIRONMENT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert ended.returncode == 137
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("finetune: the training process stopped with exit code 137 (SIGKILL: out of host")
