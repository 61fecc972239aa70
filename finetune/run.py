"""What `accelerate launch --config_file <profile> finetune/run.py [flags | recipe.yaml]` runs.

Parse arguments, build tokenizer, data and model, train with transformers.Trainer while the
measuring callbacks watch, evaluate, save a consolidated model, and leave run_summary.json and a
TensorBoard log. Everything else lives in its own module.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by accelerate launch: import the package, not its siblings
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import torch
from transformers import default_data_collator, set_seed
from transformers.integrations import TensorBoardCallback
from transformers.utils import logging

from finetune.arguments import as_record, parse_arguments
from finetune.callbacks import MeasuredTrainer, MemoryCallback, ThroughputCallback
from finetune.data import build_datasets
from finetune.devices import promote_cpu_fsdp
from finetune.errors import exit_on_user_error
from finetune.evaluation import loss_sums_per_sample, token_weighted_loss
from finetune.export import save_consolidated_model
from finetune.flops import matmul_parameters, model_flops_per_token, peak_flops, training_dtype
from finetune.models import (
    build_model,
    choose_block_size,
    count_parameters,
    load_config,
    load_tokenizer,
    resolve_model,
)
from finetune.profiles import strategy_of
from finetune.reporting import GroupedTensorBoardCallback, logging_dir
from finetune.summary import RunRecord, format_report, hardware, loss_curve, versions

logger = logging.get_logger("finetune")


def default_run_name(model: str) -> str:
    profile = os.environ.get("FINETUNE_PROFILE") or "run"
    return f"{profile}-{Path(model).name}-{time.strftime('%Y%m%d-%H%M%S')}"


def final_metrics(metrics: dict[str, float], prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}_loss": metrics.get(f"{prefix}_token_loss"),
        f"{prefix}_perplexity": metrics.get(f"{prefix}_perplexity"),
        f"{prefix}_tokens": metrics.get(f"{prefix}_tokens"),
    }


def train_and_measure(model_args: Any, data_args: Any, training_args: Any, record: RunRecord) -> None:
    record.update(
        {
            "profile": os.environ.get("FINETUNE_PROFILE"),
            "model": model_args.model,
            "from_scratch": model_args.from_scratch,
            "dataset": data_args.dataset,
            "packing": data_args.packing,
            "gradient_checkpointing": training_args.gradient_checkpointing,
            "micro_batch_size": training_args.per_device_train_batch_size,
            "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
            "global_batch_size": training_args.per_device_train_batch_size
            * training_args.gradient_accumulation_steps
            * training_args.world_size,
            "learning_rate": training_args.learning_rate,
            "seed": training_args.seed,
            "dtype": training_dtype(
                training_args.bf16, training_args.fp16, torch.backends.cuda.matmul.allow_tf32
            ),
            "arguments": as_record(model_args, data_args, training_args),
            **hardware(),
            **versions(),
        }
    )
    set_seed(training_args.seed)
    location = resolve_model(model_args.model)
    config = load_config(model_args, location)
    block_size = choose_block_size(data_args.block_size, config)
    tokenizer = load_tokenizer(model_args, location)
    data = build_datasets(
        data_args,
        tokenizer,
        block_size,
        training_args.seed,
        lambda: training_args.main_process_first(desc="dataset preparation"),
    )
    record.update(
        {
            "model_location": location,
            "data_source": data.summary.source,
            "block_size": block_size,
            "train_samples": data.summary.train_samples,
            "eval_samples": data.summary.eval_samples,
            "train_tokens": data.summary.train_tokens,
            "data_notes": data.summary.notes,
        }
    )
    if training_args.process_index == 0:
        for note in data.summary.notes:
            logger.warning(f"finetune: {data_args.dataset}: {note}")
    memory = MemoryCallback(profile_phases=training_args.profile_memory)
    model = build_model(model_args, config, location)
    memory.mark_phase("model loaded")
    token_flops = model_flops_per_token(model, config, block_size)
    peak = peak_flops(record.fields["device_name"], record.fields["dtype"], training_args.peak_tflops)
    record.update(
        {
            "parameters": count_parameters(model),
            "matmul_parameters": matmul_parameters(model),
            "num_layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "flops_per_token": token_flops,
            "peak_tflops": peak.tflops if peak else None,
            "peak_tflops_source": peak.source if peak else None,
        }
    )
    throughput = ThroughputCallback(training_args.throughput_warmup_steps, token_flops, peak)

    promote_cpu_fsdp()
    trainer = MeasuredTrainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        eval_dataset=data.evaluation,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        compute_metrics=token_weighted_loss,
        preprocess_logits_for_metrics=loss_sums_per_sample,
        callbacks=[memory, throughput],
    )
    record.update(strategy_of(trainer.accelerator))
    if "tensorboard" in training_args.report_to:
        trainer.remove_callback(TensorBoardCallback)
        log_dir = logging_dir(training_args.output_dir, training_args.run_name)
        trainer.add_callback(GroupedTensorBoardCallback(log_dir, record.fields))

    train_metrics = trainer.train().metrics
    record.update(
        {
            "steps": trainer.state.global_step,
            "train_loss": train_metrics.get("train_loss"),
            "train_runtime_s": train_metrics.get("train_runtime"),
            "loss_curve": loss_curve(trainer.state.log_history),
            **memory.summary(),
            **throughput.summary(),
            "num_hosts": len({rank["host"] for rank in throughput.ranks}) or None,
            "ranks": [
                {**progress, **readings}
                for progress, readings in zip(throughput.ranks, memory.per_rank(), strict=True)
            ],
        }
    )
    record.update(
        {"final_loss": record.fields["loss_curve"][-1]["loss"] if record.fields["loss_curve"] else None}
    )
    if training_args.profile_memory and training_args.process_index == 0:
        print(memory.report())
    record.update(final_metrics(trainer.evaluate(), "eval"))
    if data.test is not None:
        record.update(final_metrics(trainer.evaluate(data.test, metric_key_prefix="test"), "test"))
    save_consolidated_model(trainer, training_args.output_dir, tokenizer)


def main(argv: list[str] | None = None) -> None:
    logging.set_verbosity_info() if os.environ.get("FINETUNE_VERBOSE") else logging.set_verbosity_warning()
    with exit_on_user_error():
        model_args, data_args, training_args = parse_arguments(argv)
        training_args.run_name = training_args.run_name or default_run_name(model_args.model)
        is_main = training_args.process_index == 0
        record = RunRecord(training_args.output_dir, training_args.run_name, is_main)
        with record.until_exit():
            train_and_measure(model_args, data_args, training_args, record)
        if is_main:
            print(format_report(record.fields))


if __name__ == "__main__":
    main()
