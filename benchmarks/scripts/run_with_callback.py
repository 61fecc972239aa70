"""finetune/run.py as it is, with one more Trainer callback: how the profiling scripts look inside a run."""

from transformers import TrainerCallback

import finetune.run as run


def main_with(callback: TrainerCallback, argv: list[str]) -> None:
    class WithCallback(run.FinetuneTrainer):
        def __init__(self, *args, callbacks, **kwargs):
            super().__init__(*args, callbacks=[*callbacks, callback], **kwargs)

    run.FinetuneTrainer = WithCallback
    run.main(argv)
