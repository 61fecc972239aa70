"""finetune/run.py with rank 0 slow where the others wait for it: SLOW_PHASE=data (dataset
preparation) or save (the final model's save), SLOW_S seconds, for tests/test_slow_work.py:
`accelerate launch tests/slow_rank_zero_run.py RUN_FLAGS --ddp_timeout T` with T < SLOW_S."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import finetune.after_training as after_training
import finetune.run as run
import finetune.slow_work as slow_work

PHASE, SLOW_S = os.environ["SLOW_PHASE"], float(os.environ["SLOW_S"])
# a disk this slow gives the tiny test model's save minutes: the save's timeout then covers SLOW_S
slow_work.SLOWEST_DISK_BYTES_PER_S = 1e5


def slowly(function):
    def on_rank_zero_slowly(*args, **kwargs):
        if os.environ.get("RANK") == "0":
            time.sleep(SLOW_S)
        return function(*args, **kwargs)

    return on_rank_zero_slowly


if PHASE == "data":
    run.build_datasets = slowly(run.build_datasets)
else:
    after_training.save_consolidated_model = slowly(after_training.save_consolidated_model)
run.exit_without_teardown(run.main)
