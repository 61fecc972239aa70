"""finetune/run.py with a pause in every training step, for tests that stop a run while it trains and
resume it to the uninterrupted run's weights: `accelerate launch tests/paced_run.py RUN_FLAGS`.

A reference run of the byte-level test model ends its 20 steps about a second after its first
checkpoint, sooner than a loaded machine lets a test see that checkpoint and signal the ranks. Such a
test cannot train longer instead (the learning-rate schedule follows --max_steps, so the weights
would differ); paced, the same steps compute the same numbers, PAUSE_S apart."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import finetune.run as run

PAUSE_S = 0.3


class PacedTrainer(run.FinetuneTrainer):
    def training_step(self, *args, **kwargs):
        time.sleep(PAUSE_S)
        return super().training_step(*args, **kwargs)


run.FinetuneTrainer = PacedTrainer
run.exit_without_teardown(run.main)
