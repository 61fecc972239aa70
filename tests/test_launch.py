"""The launcher wrapper (finetune/launch.py) around `accelerate launch`."""

from __future__ import annotations

import os
from pathlib import Path

import accelerate.commands.launch

from finetune.launch import DEEPSPEED_ENV_FILE_VARIABLE, run_launcher

from launching import PROJECT_ROOT


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
