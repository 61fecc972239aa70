"""What a finished training ends with: the evaluation (and test) loss with its memory peak, the run's
scalars logged, the weights checked finite and saved as one consolidated model, then the samples
`--generation_prompt` asks for, generated from what was saved. A run stopped for resume or diverged
never gets here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from finetune.callbacks import MemoryCallback
from finetune.data import PreparedData
from finetune.data_formats import CHAT_FORMATS
from finetune.disk_space import expected_checkpoint_bytes
from finetune.divergence import check_weights_finite
from finetune.errors import FinetuneError
from finetune.export import save_consolidated_model
from finetune.generate import Chat, Sampling, generate
from finetune.reporting import run_scalars
from finetune.slow_work import timeout_for_save
from finetune.summary import RunRecord
from finetune.summary_fields import evaluation_fields
from finetune.trainer import FinetuneTrainer


def evaluate_save_and_generate(
    trainer: FinetuneTrainer,
    model: Any,
    data: PreparedData,
    tokenizer: PreTrainedTokenizerBase,
    memory: MemoryCallback,
    record: RunRecord,
) -> None:
    """Each result goes into `record` as it comes, the saved model before any sample is drawn."""
    training_args = trainer.args
    evaluated, evaluation_memory = memory.evaluation_peak(trainer.evaluate)
    record.update({**evaluation_fields(evaluated, "eval"), **evaluation_memory})
    record.update({"evaluation_compiled": trainer.evaluates_compiled()})
    if data.test is not None:
        record.update(evaluation_fields(trainer.evaluate(data.test, metric_key_prefix="test"), "test"))
    trainer.log(run_scalars(record.fields))
    check_weights_finite(trainer.model, trainer.state.global_step, "the model")
    with timeout_for_save(
        expected_checkpoint_bytes(Path(training_args.output_dir), model), training_args.ddp_timeout
    ):
        save_consolidated_model(trainer, training_args.output_dir, tokenizer)
    if training_args.generation_prompt and training_args.process_index == 0:
        chat = Chat() if data.summary.data_format in CHAT_FORMATS else None  # answered as trained
        record.update({"generations": samples(training_args, chat)})


def samples(training_args: Any, chat: Chat | None) -> list[dict[str, str]]:
    """`--generation_prompt`'s completions from the saved model, printed as they are recorded; none
    where nothing could be generated, which is reported in one line and leaves the run completed: it
    was trained and saved."""
    prompts = training_args.generation_prompt
    try:
        completions = generate(training_args.output_dir, prompts, Sampling(seed=training_args.seed), chat)
    except FinetuneError as error:
        print(
            f"finetune: --generation_prompt: nothing generated ({error}); the run completed", file=sys.stderr
        )
        return []
    pairs = list(zip(prompts, completions, strict=True))
    for prompt, text in pairs:
        print(f"finetune: generated: {prompt}{text}")
    return [{"prompt": prompt, "completion": text} for prompt, text in pairs]
