"""Real 2-process training runs on CPU (gloo), launched exactly as users launch them.

Each profile trains a tiny GPT-2 on WikiText-2 from $FINETUNE_DATA_DIR once (module-scoped
fixture); the tests then read what the run left behind.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from finetune.arguments import DataArguments, ModelArguments
from finetune.data import build_datasets
from finetune.models import load_tokenizer, resolve_model
from finetune.summary import read_summary

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PROFILES = ["ddp", "fsdp", "zero2", "zero3", "zero2_offload"]
BLOCK_SIZE = 64
EVAL_SAMPLES = 16
MAX_STEPS = 16
RUN_FLAGS = [
    "--model", "gpt2", "--from_scratch", "--config_overrides", "n_layer=2,n_embd=64,n_head=2",
    "--dataset", "wikitext-2-raw-v1", "--block_size", str(BLOCK_SIZE), "--max_steps", str(MAX_STEPS),
    "--batch_size", "4", "--learning_rate", "3e-3", "--max_eval_samples", str(EVAL_SAMPLES),
    "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
]  # fmt: skip
LAUNCH_TIMEOUT_S = 900


def launch(command: list[str], output_dir: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*command, *RUN_FLAGS, "--output_dir", str(output_dir)],
        cwd=PROJECT_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )
    assert result.returncode == 0, f"run failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


@pytest.fixture(scope="module", params=PROFILES)
def finished_run(request, tmp_path_factory) -> tuple[str, Path]:
    """accelerate launch --config_file accelerate_configs/PROFILE.yaml --num_processes 2 finetune/run.py"""
    profile = request.param
    output_dir = tmp_path_factory.mktemp(profile)
    config_file = f"accelerate_configs/{profile}.yaml"
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file]
    launch([*accelerate, "--num_processes", "2", "finetune/run.py"], output_dir)
    return profile, output_dir


def test_run_uses_the_profiles_strategy_on_two_ranks(finished_run):
    profile, output_dir = finished_run
    strategy = read_summary(output_dir)["strategy"]
    expected = {"ddp": "MULTI_CPU", "fsdp": "FSDP"}.get(profile, "DEEPSPEED")
    assert strategy["distributed_type"] == expected
    assert strategy["world_size"] == 2
    if expected == "DEEPSPEED":
        assert strategy["zero_stage"] == int(profile[len("zero")])


def test_every_rank_trained_every_step(finished_run):
    _, output_dir = finished_run
    ranks = read_summary(output_dir)["ranks"]
    assert [(rank["rank"], rank["steps"]) for rank in ranks] == [(0, MAX_STEPS), (1, MAX_STEPS)]


def test_loss_went_down(finished_run):
    _, output_dir = finished_run
    curve = read_summary(output_dir)["loss_curve"]
    assert curve[-1]["loss"] < curve[0]["loss"] - 0.5


def test_eval_loss_and_perplexity_are_finite(finished_run):
    _, output_dir = finished_run
    evaluation = read_summary(output_dir)["eval"]
    assert math.isfinite(evaluation["eval_loss"])
    assert evaluation["perplexity"] == pytest.approx(math.exp(evaluation["eval_loss"]))


def test_offline_wikitext_substitution_is_recorded(finished_run):
    _, output_dir = finished_run
    notes = read_summary(output_dir)["data"]["notes"]
    assert any("training on its validation split" in note for note in notes)


def test_saved_model_reloads_with_the_same_logits(finished_run):
    """A plain from_pretrained of the saved folder reproduces the distributed run's eval loss."""
    _, output_dir = finished_run
    model = AutoModelForCausalLM.from_pretrained(output_dir, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(ModelArguments(model=str(output_dir)), resolve_model(str(output_dir)))
    data_args = DataArguments(
        dataset="wikitext-2-raw-v1", block_size=BLOCK_SIZE, max_eval_samples=EVAL_SAMPLES
    )
    _, eval_dataset, _ = build_datasets(data_args, tokenizer, BLOCK_SIZE, seed=42)
    input_ids = torch.tensor(eval_dataset["input_ids"])
    with torch.no_grad():
        loss = model(input_ids=input_ids, labels=input_ids).loss.item()
    assert loss == pytest.approx(read_summary(output_dir)["eval"]["eval_loss"], rel=1e-4)


def test_finetune_run_launches_a_profile_from_any_directory(tmp_path):
    output_dir = tmp_path / "out"
    command = [sys.executable, "-m", "finetune", "run", "--profile", "zero2", "--num_processes", "2"]
    launch(command, output_dir)
    strategy = read_summary(output_dir)["strategy"]
    assert (strategy["profile"], strategy["zero_stage"], strategy["world_size"]) == ("zero2", 2, 2)
