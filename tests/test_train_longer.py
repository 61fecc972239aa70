"""`--resume` with a larger `--max_steps` trains a run further (as the Trainer allows): the schedule
planned anew for the new end and continued from the checkpoint's step, said in one line and recorded;
a damaged newest checkpoint still falls back."""

from __future__ import annotations

import json
import logging

import pytest

from finetune import run
from finetune.run_folder import MANIFEST
from finetune.summary import read_summary

from launching import TINY_MODEL

FLAGS = [
    *TINY_MODEL, "--dataset", "wikitext-2-raw-v1", "--block_size", "32", "--batch_size", "2",
    "--save_steps", "3", "--logging_steps", "1", "--max_eval_samples", "4", "--lr_scheduler_type", "linear",
    "--warmup_steps", "0", "--report_to", "none", "--disable_tqdm", "true",
]  # fmt: skip


def learning_rates(output_dir, checkpoint: str) -> dict[int, float]:
    state = json.loads((output_dir / checkpoint / "trainer_state.json").read_text())
    return {
        entry["step"]: entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry
    }


@pytest.fixture
def finished_run(tmp_path, in_process_commands):
    output_dir = tmp_path / "out"
    run.main([*FLAGS, "--max_steps", "6", "--output_dir", str(output_dir)])
    assert read_summary(output_dir)["status"] == "completed"
    return output_dir


def test_a_larger_max_steps_on_resume_continues_the_finished_run(finished_run, caplog):
    with caplog.at_level(logging.WARNING, logger="finetune"):
        run.main([*FLAGS, "--max_steps", "9", "--output_dir", str(finished_run), "--resume"])
    summary = read_summary(finished_run)
    assert (summary["status"], summary["steps"], summary["resumed_from_step"]) == ("completed", 9, 6)
    assert summary["max_steps_extended_from"] == 6
    assert any("continues to --max_steps 9" in message for message in caplog.messages)
    rates = learning_rates(finished_run, "checkpoint-9")
    # a step logs the rate it trained with: the schedule's value after the steps before it
    assert rates[6] == pytest.approx(rates[1] * (1 - 5 / 6))  # the 6-step linear schedule, near its end
    assert rates[7] == pytest.approx(rates[1] * (1 - 6 / 9))  # the 9-step one, continued at step 6


def test_a_damaged_newest_checkpoint_falls_back_and_still_trains_further(finished_run):
    (finished_run / "checkpoint-6" / MANIFEST).write_text("{")
    run.main([*FLAGS, "--max_steps", "9", "--output_dir", str(finished_run), "--resume"])
    summary = read_summary(finished_run)
    assert (summary["status"], summary["steps"], summary["resumed_from_step"]) == ("completed", 9, 3)


def test_a_smaller_max_steps_is_still_another_run(finished_run, capsys):
    with pytest.raises(SystemExit):
        run.main([*FLAGS, "--max_steps", "5", "--output_dir", str(finished_run), "--resume"])
    assert "--max_steps 6" in capsys.readouterr().err
