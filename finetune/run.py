"""What `accelerate launch --config_file <profile> finetune/run.py [flags | recipe.yaml]` runs.

Parse arguments, build tokenizer, data and model, train with transformers.Trainer, evaluate,
save a consolidated model and write run_summary.json. Everything else lives in its own module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file by accelerate launch: import the package, not its siblings
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from transformers import Trainer, default_data_collator, set_seed
from transformers.utils import logging

from finetune.arguments import as_record, parse_arguments
from finetune.callbacks import RankProgressCallback
from finetune.data import build_datasets
from finetune.devices import promote_cpu_fsdp
from finetune.errors import exit_on_user_error
from finetune.export import save_consolidated_model
from finetune.models import (
    build_model,
    choose_block_size,
    count_parameters,
    load_config,
    load_tokenizer,
    resolve_model,
)
from finetune.summary import hardware, loss_curve, perplexity, versions, write_summary

logger = logging.get_logger("finetune")


def strategy_of(trainer: Trainer) -> dict[str, object]:
    accelerator = trainer.accelerator
    strategy: dict[str, object] = {
        "profile": os.environ.get("FINETUNE_PROFILE"),
        "distributed_type": str(accelerator.distributed_type.value),
        "world_size": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
    }
    deepspeed_plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if deepspeed_plugin is not None:
        strategy["zero_stage"] = deepspeed_plugin.zero_stage
        strategy["deepspeed_config"] = deepspeed_plugin.deepspeed_config
    fsdp_plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if fsdp_plugin is not None:
        strategy["fsdp_version"] = fsdp_plugin.fsdp_version
        strategy["fsdp_reshard_after_forward"] = fsdp_plugin.reshard_after_forward
    return strategy


def main(argv: list[str] | None = None) -> None:
    logging.set_verbosity_info() if os.environ.get("FINETUNE_VERBOSE") else logging.set_verbosity_warning()
    with exit_on_user_error():
        model_args, data_args, training_args = parse_arguments(argv)
        set_seed(training_args.seed)
        location = resolve_model(model_args.model)
        config = load_config(model_args, location)
        block_size = choose_block_size(data_args.block_size, config)
        tokenizer = load_tokenizer(model_args, location)
        train_dataset, eval_dataset, data_summary = build_datasets(
            data_args,
            tokenizer,
            block_size,
            training_args.seed,
            lambda: training_args.main_process_first(desc="dataset preparation"),
        )
        model = build_model(model_args, config, location)
    if training_args.process_index == 0:
        for note in data_summary.notes:
            logger.warning(f"finetune: {data_summary.dataset}: {note}")

    promote_cpu_fsdp()
    progress = RankProgressCallback()
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=[progress],
    )
    train_metrics = trainer.train().metrics
    eval_metrics = trainer.evaluate()
    save_consolidated_model(trainer, training_args.output_dir, tokenizer)

    if trainer.accelerator.is_main_process:
        eval_loss = eval_metrics["eval_loss"]
        path = write_summary(
            training_args.output_dir,
            {
                "model": {
                    "name": model_args.model,
                    "location": location,
                    "from_scratch": model_args.from_scratch,
                    "parameters": count_parameters(trainer.model),
                },
                "strategy": strategy_of(trainer),
                "data": data_summary.as_dict(),
                "train": train_metrics,
                "eval": {**eval_metrics, "perplexity": perplexity(eval_loss)},
                "loss_curve": loss_curve(trainer.state.log_history),
                "ranks": progress.ranks,
                "hardware": hardware(),
                "versions": versions(),
                "arguments": as_record(model_args, data_args, training_args),
            },
        )
        print(
            f"finetune: eval loss {eval_loss:.4f}, perplexity {perplexity(eval_loss):.2f}; summary in {path}"
        )


if __name__ == "__main__":
    main()
