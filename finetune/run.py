"""What `accelerate launch --config_file <profile> finetune/run.py [flags | recipe.yaml]` runs.

Parse arguments, build tokenizer, data and model, train with transformers.Trainer while the
measuring callbacks watch, evaluate, save a consolidated model, and leave run_summary.json and a
TensorBoard log. Everything else lives in its own module.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

if __package__ in (None, ""):  # run as a file by accelerate launch: import the package, not its siblings
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import finetune  # noqa: F401, I001 (first: its import filters the libraries' known noise, finetune/quiet.py)
import datasets
import torch
from transformers import set_seed
from transformers.integrations import TensorBoardCallback
from transformers.utils import logging

from finetune.adapters import adapter_flags, check_adapters
from finetune.after_training import evaluate_save_and_generate
from finetune.arguments import (
    DataArguments,
    FinetuneTrainingArguments,
    ModelArguments,
    check_run_name,
)
from finetune.callbacks import MemoryCallback, StartupCallback, process_start_time
from finetune.checkpoint import (
    SaveAndStopOnSignal,
    checkpoint_to_resume,
    checkpoints_newest_first,
    load_weights_only,
    read_manifest,
)
from finetune.converters import refuse_incompatible
from finetune.data import build_datasets
from finetune.devices import load_onto_indexed_cpu, promote_cpu_fsdp
from finetune.disk_space import kept_checkpoints_problem
from finetune.errors import StoppedForResume, exit_on_user_error
from finetune.garbage_collection import GarbageCollectionCallback
from finetune.evaluation import token_weighted_loss
from finetune.flops import model_flops_per_token, peak_flops
from finetune.fsdp_units import count_units, prefetch_depth
from finetune.losses import compile_loss, loss_sums_per_sample
from finetune.models import (
    check_attention_implementation,
    choose_block_size,
    load_config,
    load_tokenizer,
    resolve_model,
    vocabulary_growth,
)
from finetune.model_setup import prepare_model
from finetune.outputs import DeleteReplacedAtFirstStep, claim_output_dir, earlier_results_back_unless_trained
from finetune.packing import number_examples_without_reading_back
from finetune.zero3_grad_norm import zero3_norm_in_one_kernel
from finetune.launch_settings import set_up_devices
from finetune.launched import BatchGeometry, Launch
from finetune.resolved import resolve_run
from finetune.sequence_parallel import (
    attend_within_packed_examples,
    check_data,
    check_model,
    collate_for_split,
)
from finetune.reporting import GroupedTensorBoardCallback
from finetune.run_folder import logging_dir
from finetune.reshard import StepCountersOnTheirDevice, continue_on_this_world_size
from finetune.slow_work import machine_first_rank_first
from finetune.resume import (
    ContinueTheReplannedSchedule,
    check_resume,
    defining_flags,
    extended_from,
    how_to_go_on_after_divergence,
    how_to_continue,
)
from finetune.run_report import format_report
from finetune.summary import RunRecord
from finetune.throughput import ThroughputCallback
from finetune.summary_fields import (
    configuration_fields,
    data_fields,
    doctor_fields,
    model_fields,
    resume_fields,
    training_fields,
)
from finetune.trainer import FinetuneTrainer
from finetune.watchdog import Watchdog

logger = logging.get_logger("finetune")


def default_run_name(model: str, training_args: FinetuneTrainingArguments, launch: Launch) -> str:
    """Profile, model, devices and batch, then the time: what tells runs apart in one TensorBoard.

    The profile is the launched strategy's name: `finetune run`'s profile, or for a bare `accelerate
    launch` the shipped profile's name for what was launched."""
    devices = f"{launch.world_size}{'gpu' if launch.on_gpu else 'cpu'}"
    geometry = BatchGeometry.of(training_args, launch.data_parallel_size)
    batch = f"b{geometry.micro}x{geometry.accumulation}"
    return f"{launch.strategy.name}-{Path(model).name}-{devices}-{batch}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_defining_flags(
    model_args: ModelArguments, data_args: DataArguments, training_args: FinetuneTrainingArguments
) -> dict[str, Any]:
    """The flags a checkpoint records and a resume must match, the adapter's among them: a LoRA
    checkpoint continued as full fine-tuning (or with another rank) would not continue that run."""
    return {**defining_flags(model_args, data_args, training_args), **adapter_flags(model_args)}


def train_and_measure(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: FinetuneTrainingArguments,
    launch: Launch,
    record: RunRecord,
    resume_from: Path | None,
) -> None:
    """The run in its order: data, model, Trainer, training, then evaluation, the saved model and any
    samples; each measurement goes into `record` as soon as it is known, so that a run that fails
    part-way leaves a summary of what it got to."""
    startup = StartupCallback()
    startup.mark("imports")
    if training_args.disable_tqdm:  # the Trainer's bar follows the flag; the libraries' own bars do not
        logging.disable_progress_bar()
        datasets.disable_progress_bars()
    configuration = configuration_fields(model_args, data_args, training_args, launch)
    record.update(configuration)
    dtype, device_name = configuration["dtype"], configuration["device_name"]
    record.update(doctor_fields(Path(training_args.output_dir)))
    set_seed(training_args.seed)
    location = resolve_model(model_args.model)
    config = load_config(model_args, location)
    meta_model = check_attention_implementation(model_args, config)
    degree, split = launch.layout.sequence_parallel, launch.sequence_split
    check_model(meta_model, config, degree, split, model_args.attn_implementation)
    if model_args.peft and meta_model is not None:
        check_adapters(meta_model, model_args.lora_target_modules, model_args.lora_rank)
    del meta_model
    block_size = choose_block_size(data_args.block_size, config)
    tokenizer = load_tokenizer(model_args, location)
    new_tokens = vocabulary_growth(model_args, config, tokenizer)  # before the data, which uses them
    data = build_datasets(
        data_args,
        tokenizer,
        block_size,
        training_args.seed,
        lambda: machine_first_rank_first(
            training_args.local_process_index,
            launch.processes_per_machine,
            training_args.output_dir,
            "dataset preparation",
        ),
    )
    record.update(data_fields(location, block_size, data.summary))
    BatchGeometry.of(training_args, launch.data_parallel_size).check_fits(data.summary.train_samples)
    packed_examples = data.summary.packing and data.summary.data_format != "text"
    check_data(split, degree, packed_examples)
    number_examples_without_reading_back(packed_examples)
    attend_within_packed_examples(split, degree, packed_examples)  # before accelerate hands sdpa to Ulysses
    startup.mark("data")
    if training_args.process_index == 0:
        for note in data.summary.notes:
            logger.warning(f"finetune: {data_args.dataset}: {note}")

    memory = MemoryCallback(profile_phases=training_args.profile_memory)  # before the model: its phases
    model, compile_plan = prepare_model(
        model_args, training_args, launch, config, location, tokenizer, new_tokens, dtype, record.update
    )
    memory.mark_phase("model loaded")
    startup.mark("model")
    token_flops = model_flops_per_token(model, config, block_size)
    peak = peak_flops(device_name, dtype, training_args.peak_tflops)
    record.update(model_fields(model, config, token_flops, peak))
    throughput = ThroughputCallback(training_args.throughput_warmup_steps, launch.layout, token_flops, peak)
    extension = extended_from(resume_from, training_args)
    record.update({"max_steps_extended_from": extension[0] if extension else None})
    if extension and training_args.process_index == 0:
        planned, step = extension
        logger.warning(
            f"finetune: --resume: {resume_from.name} of a {planned}-step run continues to --max_steps "
            f"{training_args.max_steps}: the learning-rate schedule is planned anew for "
            f"{training_args.max_steps} steps and continues from step {step}"
        )
    stop = SaveAndStopOnSignal()
    collections = GarbageCollectionCallback(training_args.gc_interval)

    def end_hung_run(message: str, folder: Path) -> None:
        newest = checkpoints_newest_first(training_args.output_dir)
        record.update({"status": "interrupted", "error": message, "hang": str(folder),
                       "checkpoint": str(newest[0]) if newest else None})  # fmt: skip
        record.write(by_this_rank=True)  # the reporting rank: rank 0, or another where rank 0 froze

    watchdog = Watchdog(
        training_args.watchdog_s,
        training_args.output_dir,
        training_args.process_index,
        launch.world_size,
        end_hung_run,
    )

    promote_cpu_fsdp(launch)
    zero3_norm_in_one_kernel(launch.strategy)  # before the Trainer builds DeepSpeed's optimizer
    trainer = FinetuneTrainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        eval_dataset=data.evaluation,
        processing_class=tokenizer,
        data_collator=collate_for_split(data.collator, split, degree, launch.on_gpu, block_size),
        compute_metrics=token_weighted_loss,
        preprocess_logits_for_metrics=loss_sums_per_sample,
        callbacks=[
            memory,
            throughput,
            collections,
            stop,
            startup,
            StepCountersOnTheirDevice(),
            watchdog,
            DeleteReplacedAtFirstStep(training_args.output_dir),
        ]
        + ([ContinueTheReplannedSchedule()] if extension else []),
        run_flags=run_defining_flags(model_args, data_args, training_args),
        launch=launch,
        compile_plan=compile_plan,
        data_source=data.summary.source,
    )
    launch.check_against(trainer.accelerator, compile_plan)
    resumed = resume_fields(resume_from)
    record.update({**launch.strategy_fields(), **compile_plan.summary_fields(), **resumed})
    if compile_plan.loss:
        compile_loss(model)
    if "tensorboard" in training_args.report_to:
        trainer.remove_callback(TensorBoardCallback)
        log_dir = logging_dir(training_args.output_dir, training_args.run_name)
        purge_step = resumed["resumed_from_step"]
        trainer.add_callback(GroupedTensorBoardCallback(log_dir, record.fields, purge_step=purge_step))

    if training_args.save_strategy != "no" and training_args.process_index == 0:
        problem = kept_checkpoints_problem(
            Path(training_args.output_dir), model, training_args.save_total_limit
        )
        if problem:
            logger.warning(f"finetune: {problem}")
    try:
        train_metrics = trainer.train(
            resume_from_checkpoint=str(resume_from) if resume_from else None
        ).metrics
    finally:  # a training ended by an exception (diverged, stopped) must not leave the watchdog armed
        watchdog.stop()  # nor Python's garbage collection off
        collections.stop()
    trained = training_fields(
        trainer.state, training_args.output_dir, train_metrics, memory, throughput, collections
    )
    record.update(trained)
    units = count_units(trainer.model)
    record.update(
        {"fsdp_units": units or None, "fsdp_prefetch": prefetch_depth(trainer.model) if units else None}
    )
    record.update({"ddp_gradient_buckets": trainer.ddp_gradient_buckets()})
    record.update(startup.summary())
    if stop.received:
        checkpoint = trained["checkpoint"]
        raise StoppedForResume(
            f"stopped by {stop.received} at step {stop.stopped_at_step} with checkpoint "
            f"{checkpoint}: {how_to_continue(checkpoint)}"
        )
    if training_args.profile_memory and training_args.process_index == 0:
        print(memory.report())
    evaluate_save_and_generate(trainer, model, data, tokenizer, memory, record)


def main(argv: list[str] | None = None) -> None:
    load_weights_only()
    logging.set_verbosity_info() if os.environ.get("FINETUNE_VERBOSE") else logging.set_verbosity_warning()
    with exit_on_user_error():
        resolved = resolve_run(argv)
        model_args, data_args, training_args, launch = (
            resolved.model_args,
            resolved.data_args,
            resolved.training_args,
            resolved.launch,
        )
        load_onto_indexed_cpu(launch)
        set_up_devices(training_args, launch)
        refuse_incompatible(model_args, training_args, launch)
        claim_output_dir(training_args, launch, model_args.folders_read())
        with earlier_results_back_unless_trained(
            Path(training_args.output_dir), training_args.process_index == 0
        ):
            run_in_claimed_folder(model_args, data_args, training_args, launch)


def run_in_claimed_folder(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: FinetuneTrainingArguments,
    launch: Launch,
) -> None:
    """Resume or start, train, report: everything after output_dir is this run's."""
    resume_from = checkpoint_to_resume(
        training_args.output_dir, training_args.resume, training_args.resume_from_checkpoint
    )
    flags = run_defining_flags(model_args, data_args, training_args)
    finished = check_resume(resume_from, flags, training_args, launch)
    if finished:
        if training_args.process_index == 0:
            print(f"finetune: {finished}: nothing to do")
        return
    if resume_from and not training_args.run_name:  # a checkpoint's manifest is input too
        check_run_name(read_manifest(resume_from)["run_name"], f"run_name in {resume_from}'s manifest")
    training_args.run_name = (
        training_args.run_name
        or (resume_from and read_manifest(resume_from)["run_name"])
        or default_run_name(model_args.model, training_args, launch)
    )
    resume_from = continue_on_this_world_size(resume_from, training_args, launch)
    is_main = training_args.process_index == 0
    if resume_from and is_main:
        print(f"finetune: resuming from {resume_from} (step {read_manifest(resume_from).get('step')})")
    record = RunRecord(
        training_args.output_dir, training_args.run_name, is_main, started_at=process_start_time()
    )
    with record.until_exit(), how_to_go_on_after_divergence(training_args.output_dir):
        train_and_measure(model_args, data_args, training_args, launch, record, resume_from)
    if is_main:
        print(format_report(record.fields))


def exit_without_teardown(entry: Callable[[], None]) -> NoReturn:
    """Run a rank's entry point, then exit with its code, skipping the interpreter's teardown where a
    process group is up.

    Tearing down a gloo process group at interpreter exit races with its worker threads: the DDP
    reducer's last reference releases the group, whose destructor joins a worker still destroying
    its last collective's tensors, which waits for the GIL the joining thread holds. The rank then
    hangs or aborts ("terminate called without an active exception", pytorch/pytorch#190489) after
    a run that succeeded (seen on CPU under load, stack read with gdb). Nothing is left to do at
    that point: the atexit handlers (the output folder's lock among them) and the streams are run
    and flushed, and the process ends with os._exit and the entry point's code.
    """
    code: int | str | None = 0
    try:
        entry()
    except SystemExit as stop:
        code = stop.code
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        sys.exit(code)
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    exit_without_teardown(main)
