"""finetune/run.py with rank 1 stalled inside step STALL_STEP (a sleep in its training step), for
tests/test_watchdog.py: `accelerate launch tests/stalled_run.py RUN_FLAGS`. With FREEZE_RANK_0=1,
rank 0 stops itself there instead (SIGSTOP: its watchdog thread frozen with it)."""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import finetune.run as run

STALL_STEP = 3


class StalledTrainer(run.FinetuneTrainer):
    def training_step(self, *args, **kwargs):
        if self.state.global_step == STALL_STEP - 1:
            if os.environ.get("FREEZE_RANK_0") == "1" and os.environ.get("RANK") == "0":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif os.environ.get("FREEZE_RANK_0") != "1" and os.environ.get("RANK") == "1":
                time.sleep(3600)  # the line the watchdog must name
        return super().training_step(*args, **kwargs)


run.FinetuneTrainer = StalledTrainer
run.exit_without_teardown(run.main)
