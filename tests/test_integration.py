"""Real 2-process training runs on CPU (gloo), launched exactly as users launch them.

Each profile's reference run (tests/runs.py: a tiny GPT-2 trained on WikiText-2 from
$FINETUNE_DATA_DIR, made once for the session) is what the tests read: what the run left behind
(run_summary.json, the TensorBoard log, the saved model), checked against what they compute themselves.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from finetune import cli, run
from finetune.data import build_datasets
from finetune.losses import loss_sums_per_sample
from finetune.models import load_tokenizer, resolve_model
from finetune.run_flags import DataArguments, ModelArguments
from finetune.summary import read_summary, validate_summary

from launching import BYTE_GPT2, ENVIRONMENT, PROJECT_ROOT, TINY_MODEL, accelerate_launch, launch
from runs import (
    BLOCK_SIZE,
    CHECKPOINT_STEPS,
    EVAL_SAMPLES,
    FLAGS,
    GENERATION_PROMPT,
    MAX_STEPS,
    NO_CHECKPOINTS,
    PROFILES,
    THROUGHPUT_WARMUP_STEPS,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=PROFILES)
def finished_run(request, reference_run) -> tuple[str, Path]:
    """accelerate launch --config_file accelerate_configs/PROFILE.yaml --num_processes 2 finetune/run.py"""
    return request.param, reference_run(request.param)


def test_run_uses_the_profiles_strategy_on_two_ranks(finished_run):
    profile, output_dir = finished_run
    summary = read_summary(output_dir)
    expected = {"ddp": "MULTI_CPU", "fsdp": "FSDP"}.get(profile, "DEEPSPEED")
    assert summary["distributed_type"] == expected
    assert summary["world_size"] == 2
    assert (summary["strategy"], summary["data_parallel_size"]) == (profile, 2)
    if expected == "DEEPSPEED":
        assert summary["zero_stage"] == int(profile[len("zero")])


def test_summary_has_exactly_the_documented_fields(finished_run):
    _, output_dir = finished_run
    summary = read_summary(output_dir)
    assert validate_summary(summary) == []
    assert summary["status"] == "completed"


def test_every_rank_trained_every_step(finished_run):
    _, output_dir = finished_run
    ranks = read_summary(output_dir)["ranks"]
    assert [(rank["rank"], rank["steps"]) for rank in ranks] == [(0, MAX_STEPS), (1, MAX_STEPS)]


def test_loss_went_down(finished_run):
    _, output_dir = finished_run
    curve = read_summary(output_dir)["loss_curve"]
    assert curve[-1]["loss"] < curve[0]["loss"] - 0.5


def test_eval_perplexity_is_exp_of_the_eval_loss(finished_run):
    _, output_dir = finished_run
    summary = read_summary(output_dir)
    assert math.isfinite(summary["eval_loss"])
    assert summary["eval_perplexity"] == pytest.approx(math.exp(summary["eval_loss"]))
    assert summary["eval_tokens"] == EVAL_SAMPLES * (BLOCK_SIZE - 1)


def test_the_final_evaluation_time_is_recorded_within_the_run_time(finished_run):
    _, output_dir = finished_run
    summary = read_summary(output_dir)
    assert 0 < summary["eval_runtime_s"] < summary["wall_time_s"]


def test_an_eager_run_records_its_evaluation_as_eager(finished_run):
    _, output_dir = finished_run
    assert read_summary(output_dir)["evaluation_compiled"] is False


def test_throughput_counts_the_tokens_of_both_ranks_after_warm_up(finished_run):
    _, output_dir = finished_run
    summary = read_summary(output_dir)
    # a step that follows a checkpoint is not timed: its time includes the save
    saves_before_the_end = len([step for step in CHECKPOINT_STEPS if step < MAX_STEPS])
    assert summary["throughput_steps"] == MAX_STEPS - THROUGHPUT_WARMUP_STEPS - saves_before_the_end
    # packed blocks have no padding: every sample is BLOCK_SIZE real tokens
    assert summary["tokens_per_second"] / summary["samples_per_second"] == pytest.approx(BLOCK_SIZE)
    assert summary["tokens_per_second_per_device"] == pytest.approx(summary["tokens_per_second"] / 2)
    assert summary["step_time_median_s"] <= summary["step_time_p90_s"]


def test_memory_is_the_max_and_mean_over_both_ranks(finished_run):
    _, output_dir = finished_run
    summary = read_summary(output_dir)
    peaks = [rank["host_peak_rss_gib"] for rank in summary["ranks"]]
    assert len(peaks) == 2
    assert summary["memory_device"] == "cpu"
    assert summary["memory_host_peak_rss_gib_max"] == max(peaks)
    assert summary["memory_host_peak_rss_gib_mean"] == pytest.approx(sum(peaks) / 2)
    assert summary["memory_host_peak_rss_rank"] == peaks.index(max(peaks))


def test_tensorboard_log_holds_the_runs_measurements(finished_run):
    _, output_dir = finished_run
    (log_dir,) = (output_dir / "runs").iterdir()
    assert log_dir.name == read_summary(output_dir)["run_name"]
    events = EventAccumulator(str(log_dir))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    expected = {
        "train/loss",
        "memory/host_peak_rss_gib_max",
        "throughput/tokens_per_second_per_device",
        "eval/perplexity",
        "run/tokens_per_second_per_device",
        "run/peak_memory_gib",
    }
    assert expected <= scalars
    assert events.Scalars("train/loss")[-1].step == MAX_STEPS


@pytest.mark.parametrize("finished_run", ["zero2", "zero3"], indirect=True)
def test_chunked_loss_trains_like_the_models_own_loss(finished_run, tmp_path):
    """Same losses and evaluation with --chunked_loss, under DeepSpeed's own backward (the chunks'
    custom backward under the others is checked in-process by tests/test_losses.py); under ZeRO-3
    training keeps the model's loss and evaluation gathers the partitioned output weight."""
    profile, output_dir = finished_run
    launch(accelerate_launch(profile), tmp_path, [*FLAGS, *NO_CHECKPOINTS, "--chunked_loss", "true"])
    own, chunked = read_summary(output_dir), read_summary(tmp_path)
    assert chunked["arguments"]["chunked_loss"] and not own["arguments"]["chunked_loss"]
    assert [p["loss"] for p in chunked["loss_curve"]] == pytest.approx(
        [p["loss"] for p in own["loss_curve"]], rel=1e-3
    )
    assert chunked["eval_loss"] == pytest.approx(own["eval_loss"], rel=1e-3)


@pytest.mark.parametrize("finished_run", ["fsdp", "zero3"], indirect=True)
def test_compiled_run_trains_like_the_eager_run(finished_run, tmp_path):
    """Compiled by default on GPUs: FSDP2 block by block as its profile asks (FSDP's hooks run between
    the compiled blocks), and ZeRO-3's leaf blocks' forwards between DeepSpeed's hooks, the hardest
    cases; DDP's one graph is the GPU benchmarks' default."""
    profile, output_dir = finished_run
    launch(accelerate_launch(profile), tmp_path, [*FLAGS, *NO_CHECKPOINTS, "--torch_compile", "true"])
    eager, compiled = read_summary(output_dir), read_summary(tmp_path)
    assert compiled["torch_compile"] and not eager["torch_compile"]
    assert compiled["torch_compile_regional"] is (profile == "fsdp")
    assert compiled["zero3_compiled_blocks"] == (2 if profile == "zero3" else None)  # n_layer=2
    assert compiled["loss_compiled"] and not eager["loss_compiled"]
    # Inductor draws its own dropout masks, so the curves agree closely, not exactly (seen: 1.2e-3
    # apart by step 16 under FSDP2); a compile that lost gradients or FSDP's gathers stays near 10.8.
    assert [p["loss"] for p in compiled["loss_curve"]] == pytest.approx(
        [p["loss"] for p in eager["loss_curve"]], rel=3e-3
    )
    assert compiled["eval_loss"] == pytest.approx(eager["eval_loss"], rel=3e-3)
    assert reloaded_eval_loss(tmp_path) == pytest.approx(compiled["eval_loss"], rel=1e-4)


def test_zero3_gathers_each_transformer_block_as_one_deepspeed_leaf_module(finished_run):
    profile, output_dir = finished_run
    expected = ["GPT2Block"] if profile.startswith("zero3") else None
    assert read_summary(output_dir)["zero3_leaf_modules"] == expected


@pytest.mark.parametrize("finished_run", ["zero3"], indirect=True)
def test_zero3_json_naming_its_own_leaf_modules_is_followed_trains_the_same_and_runs_eager(
    finished_run, tmp_path
):
    """An empty list of leaf classes: DeepSpeed's hooks on every module, which must train like one
    gather per block; asked to compile, it runs eager (compiling across those hooks was slower)."""
    profile, output_dir = finished_run
    config = json.loads((PROJECT_ROOT / "ds_configs" / "zero3.json").read_text())
    config["zero_optimization"]["leaf_module"] = {"classes": []}
    per_module_json = tmp_path / "zero3_per_module.json"
    per_module_json.write_text(json.dumps(config))
    command = accelerate_launch(profile)
    script = command.index("finetune/run.py")
    command[script:script] = ["--deepspeed_config_file", str(per_module_json)]
    launch(command, tmp_path / "run", [*FLAGS, *NO_CHECKPOINTS, "--torch_compile", "true"])
    per_block, per_module = read_summary(output_dir), read_summary(tmp_path / "run")
    assert per_module["zero3_leaf_modules"] is None
    assert per_module["torch_compile"] is False and per_module["zero3_compiled_blocks"] is None
    assert [p["loss"] for p in per_module["loss_curve"]] == pytest.approx(
        [p["loss"] for p in per_block["loss_curve"]], rel=1e-4
    )


def test_offline_wikitext_substitution_is_recorded(finished_run):
    _, output_dir = finished_run
    notes = read_summary(output_dir)["data_notes"]
    assert any("training on its validation split" in note for note in notes)


def test_saved_model_reloads_with_the_same_logits(finished_run):
    """A plain from_pretrained of the saved folder reproduces the distributed run's eval loss."""
    _, output_dir = finished_run
    assert reloaded_eval_loss(output_dir) == pytest.approx(read_summary(output_dir)["eval_loss"], rel=1e-4)


def reloaded_eval_loss(output_dir: Path) -> float:
    model = AutoModelForCausalLM.from_pretrained(output_dir, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(ModelArguments(model=str(output_dir)), resolve_model(str(output_dir)))
    data_args = DataArguments(
        dataset="wikitext-2-raw-v1", block_size=BLOCK_SIZE, max_eval_samples=EVAL_SAMPLES
    )
    eval_dataset = build_datasets(data_args, tokenizer, BLOCK_SIZE, seed=42).evaluation
    input_ids = torch.tensor(eval_dataset["input_ids"])
    with torch.no_grad():
        return model(input_ids=input_ids, labels=input_ids).loss.item()


def test_finetune_eval_of_the_saved_model_agrees_with_the_training_evaluation(
    finished_run, in_process_commands, capsys
):
    _, output_dir = finished_run
    capsys.readouterr()
    # offline WikiText-2 has no train split, so the run evaluated on its test file (data_notes)
    code = cli.main(["eval", str(output_dir), "--split", "test", "--block_size", str(BLOCK_SIZE),
                     "--max_tokens", str(EVAL_SAMPLES * BLOCK_SIZE)])  # fmt: skip
    assert code == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    summary = read_summary(output_dir)
    assert evaluated["tokens"] == summary["eval_tokens"]
    assert evaluated["loss"] == pytest.approx(summary["eval_loss"], rel=1e-5)


def test_finetune_run_launches_a_profile_from_any_directory(reference_run):
    """zero2's reference run is the one launched by `finetune run`, from outside the checkout."""
    summary = read_summary(reference_run("zero2"))
    assert (summary["profile"], summary["zero_stage"], summary["world_size"]) == ("zero2", 2, 2)
    assert summary["run_name"].startswith(f"zero2-{BYTE_GPT2.name}-2cpu-b4x1-")
    (generation,) = summary["generations"]
    assert generation["prompt"] == GENERATION_PROMPT
    assert generation["completion"]


# Perplexity over texts of different lengths, split over two ranks


@pytest.fixture(scope="module")
def padded_run(tmp_path_factory) -> tuple[Path, Path]:
    """DDP on 2 ranks, one padded sample per text: ranks see different token counts and losses.

    Seven validation texts of 2 to 44 words with an eval batch of 2 per rank: the ranks' batches
    hold different numbers of real tokens, and the last batch is evened out with a repeated sample
    that must not be counted.
    """
    folder = tmp_path_factory.mktemp("padded-data")
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"]
    train = [" ".join(words[: 3 + i % 12]) for i in range(80)]
    valid = [" ".join((words * 4)[: 2 + 7 * i]) for i in range(7)]
    (folder / "train.txt").write_text("\n".join(train) + "\n")
    (folder / "valid.txt").write_text("\n".join(valid) + "\n")
    output_dir = tmp_path_factory.mktemp("padded-run")
    flags = [
        *TINY_MODEL, "--dataset", str(folder), "--no_packing", "--block_size", str(BLOCK_SIZE),
        "--max_steps", "4", "--batch_size", "4", "--per_device_eval_batch_size", "2",
        "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
    ]  # fmt: skip
    launch(accelerate_launch("ddp"), output_dir, flags)
    return folder, output_dir


def test_perplexity_weighs_every_validation_token_once(padded_run):
    folder, output_dir = padded_run
    model = AutoModelForCausalLM.from_pretrained(output_dir, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(ModelArguments(model=str(output_dir)), resolve_model(str(output_dir)))
    data_args = DataArguments(dataset=str(folder), block_size=BLOCK_SIZE, packing=False)
    evaluation = build_datasets(data_args, tokenizer, BLOCK_SIZE, seed=42).evaluation
    assert len(evaluation) == 7
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor(evaluation["input_ids"]),
            attention_mask=torch.tensor(evaluation["attention_mask"]),
        ).logits
    sums = loss_sums_per_sample(logits, torch.tensor(evaluation["labels"]))
    token_weighted = (sums[:, 0].sum() / sums[:, 1].sum()).item()
    mean_of_sample_means = (sums[:, 0] / sums[:, 1]).mean().item()
    summary = read_summary(output_dir)
    assert summary["eval_tokens"] == int(sums[:, 1].sum())
    assert summary["eval_loss"] == pytest.approx(token_weighted, rel=1e-5)
    assert abs(mean_of_sample_means - token_weighted) > 1e-3  # the data tells the two apart
    assert summary["eval_perplexity"] == pytest.approx(math.exp(token_weighted), rel=1e-5)


# Runs that do not complete still leave a summary


def single_process(output_dir: Path, *flags: str) -> list[str]:
    return [sys.executable, "finetune/run.py", *FLAGS, "--output_dir", str(output_dir), *flags]


def test_failed_run_leaves_a_summary_that_says_why(tmp_path, in_process_commands):
    """run.main in this process: the data is looked up after the summary is started, and it fails there."""
    output_dir = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        run.main([*FLAGS, "--output_dir", str(output_dir), "--dataset", "no-such-dataset"])
    assert stopped.value.code == 2
    summary = read_summary(output_dir)
    assert summary["status"] == "failed"
    assert "no-such-dataset" in summary["error"]
    assert validate_summary(summary) == []


def default_ctrl_c() -> None:
    """Ctrl-C as a terminal delivers it, even when these tests run in a background job, whose
    commands inherit SIGINT ignored (and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_a_summary_marked_interrupted(tmp_path):
    output_dir = tmp_path / "out"
    command = single_process(output_dir, *NO_CHECKPOINTS, "--max_steps", "100000")
    with subprocess.Popen(
        command,
        cwd=PROJECT_ROOT,
        env=ENVIRONMENT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_ctrl_c,
    ) as process:
        for line in process.stdout:
            if "| loss " in line:  # the first training log's line
                break
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            pytest.fail(
                f"still running 120 s after SIGINT (exit {process.returncode}); output ends: {output[-3000:]}"
            )
    assert process.returncode == 130, output[-3000:]
    summary = read_summary(output_dir)
    assert (summary["status"], summary["error"]) == ("interrupted", "interrupted by SIGINT")
    assert summary["model"] == str(BYTE_GPT2)
