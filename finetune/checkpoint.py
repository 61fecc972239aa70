"""Checkpoints that are complete or absent, resuming from the newest good one, and stopping with a
checkpoint when the scheduler asks (SIGTERM, or SIGUSR1 as SLURM sends before a time limit).

The Trainer writes a checkpoint into `output_dir/.staging/checkpoint-N`; once every rank has
finished, the main process writes a manifest (every file, its size and sha256) and renames the folder to
`output_dir/checkpoint-N` (one rename: the checkpoint appears whole or not at all). Resume checks
the manifest against the files, so a checkpoint truncated or damaged afterwards is skipped with a
warning in favour of the one before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import stat
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.utils import logging

from finetune import safe_unpickling
from finetune.collectives import collective, host_group
from finetune.errors import FinetuneError
from finetune.run_folder import CHECKPOINT_PATTERN, CHECKPOINT_PREFIX, MANIFEST

logger = logging.get_logger("finetune")

TRAINER_STATE = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def sha256_of(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def file_records(checkpoint: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file, so resume and export notice bytes damaged with the size kept."""
    return {
        str(path.relative_to(checkpoint)): {"size": path.stat().st_size, "sha256": sha256_of(path)}
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def write_manifest(
    checkpoint: Path, step: int, run_name: str, run: dict[str, Any] | None = None, model_only: bool = False
) -> None:
    """`run` is the identity of the run that wrote the checkpoint (finetune/resume.py), checked on resume.

    A `--peft` run's checkpoint says that it holds the adapters only, and names the base they need; a
    `--save_only_model` run's, that it holds no optimizer, scheduler or data position to resume.
    """
    files = file_records(checkpoint)
    manifest: dict[str, Any] = {"step": step, "run_name": run_name, "files": files}
    if model_only:
        manifest["model_only"] = True
    if run is not None:
        manifest["run"] = run
        flags = run.get("flags", {})
        if flags.get("peft"):
            manifest["weights"] = (
                f"{flags['peft']} adapters only: the frozen base model, {flags['model']}, is not in this "
                "checkpoint (finetune export writes the adapters, or with --merge the merged model)"
            )
    (checkpoint / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def publish(staged: Path, final: Path) -> None:
    """Make a fully written checkpoint visible under its final name, replacing an older copy."""
    if final.exists():
        retired = staged.with_name(staged.name + ".retired")
        os.replace(final, retired)
        shutil.rmtree(retired)
    os.replace(staged, final)


def remove_if_empty(staging: Path) -> None:
    """The staging folder goes once nothing is staged in it (a published or removed copy was its last)."""
    if staging.is_dir() and not any(staging.iterdir()):
        staging.rmdir()


def read_manifest(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / MANIFEST).read_text())


def holds_model_only(checkpoint: Path) -> bool:
    """Written under --save_only_model: weights without the states a resume continues from."""
    try:
        return bool(read_manifest(checkpoint).get("model_only"))
    except (OSError, ValueError, AttributeError):  # no manifest, or not one: the resume's checks say so
        return False


def manifest_files_problem(checkpoint: Path, files: Any) -> str | None:
    """What is wrong with a manifest's `files` before any of them is opened: a name outside the
    checkpoint (`../x`, `/dev/zero`), a record of the wrong shape, a path that is not a regular file
    (opening a FIFO would wait forever), or no files at all."""
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} is damaged: it lists no files"
    inside = checkpoint.resolve()
    for name, record in files.items():
        size_only = isinstance(record, int) and not isinstance(record, bool)
        hashed = isinstance(record, dict) and isinstance(record.get("size"), int)
        if not (size_only or (hashed and isinstance(record.get("sha256"), str))):
            return f"{MANIFEST} is damaged: the record of {name!r:.60} is not a size and a sha256"
        path = checkpoint / name
        if Path(name).is_absolute() or not path.resolve().is_relative_to(inside):
            return f"{MANIFEST} names {name!r:.60}, which is not inside the checkpoint"
        try:
            mode = path.stat().st_mode
        except OSError as error:
            return f"{name}: {error.strerror}"
        if not stat.S_ISREG(mode):
            return f"{name} is not a regular file"
    return None


def folder_step(checkpoint: Path) -> int | None:
    """The step a checkpoint folder's name gives (checkpoint-N), or None for another name."""
    match = CHECKPOINT_PATTERN.match(checkpoint.name)
    return int(match.group(1)) if match else None


def step_problem(checkpoint: Path, manifest: dict[str, Any]) -> str | None:
    """The manifest's step and the folder's name must agree (trainer_state_problem holds
    trainer_state.json's to the name): the Trainer continues from the state's, the run reports the
    folder's."""
    step = folder_step(checkpoint)
    if step is not None and manifest.get("step", step) != step:
        return f"{MANIFEST} says step {manifest.get('step')!r:.20}, the folder's name step {step}"
    return None


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None if every file it was written with is intact."""
    try:
        manifest = read_manifest(checkpoint)
    except OSError as error:
        return f"no readable {MANIFEST} ({error.strerror}): it was not completely written"
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{MANIFEST} is damaged"
    if not isinstance(manifest, dict):
        return f"{MANIFEST} is damaged: not a JSON object"
    files = manifest.get("files")
    problem = manifest_files_problem(checkpoint, files)
    if problem:
        return problem
    for name, record in files.items():
        size = record if isinstance(record, int) else record["size"]
        actual = (checkpoint / name).stat().st_size
        if actual != size:
            return f"{name} has {actual} bytes, {size} were written"
    if any(isinstance(record, int) for record in files.values()):
        logger.warning(
            f"finetune: {checkpoint}: its {MANIFEST} holds file sizes only (written before content "
            "hashes were recorded): sizes checked, damaged bytes of the right size would go unnoticed"
        )
    else:
        for name, record in files.items():
            if sha256_of(checkpoint / name) != record["sha256"]:
                return f"{name} does not hold the bytes that were written (its sha256 differs)"
    return step_problem(checkpoint, manifest) or trainer_state_problem(
        checkpoint / TRAINER_STATE, folder_step(checkpoint)
    )


# What each of trainer_state.json's fields (transformers.TrainerState) may hold. The Trainer loads the
# file into its dataclass unchecked: an unknown key is a TypeError, a string step a TypeError deep in
# the loop, a negative step a run that "trains" from there and reports success.
COUNT, NUMBER, OPTIONAL_COUNT = (int,), (int, float), (int, type(None))
TRAINER_STATE_FIELDS: dict[str, tuple[type, ...]] = {
    "epoch": NUMBER, "global_step": COUNT, "max_steps": COUNT, "logging_steps": NUMBER,
    "eval_steps": NUMBER, "save_steps": NUMBER, "train_batch_size": OPTIONAL_COUNT,
    "num_train_epochs": NUMBER, "num_input_tokens_seen": COUNT, "total_flos": NUMBER,
    "log_history": (list,), "best_metric": (int, float, type(None)), "best_global_step": OPTIONAL_COUNT,
    "best_model_checkpoint": (str, type(None)), "is_local_process_zero": (bool,),
    "is_world_process_zero": (bool,), "is_hyper_param_search": (bool,), "trial_name": (str, type(None)),
    "trial_params": (dict, type(None)), "stateful_callbacks": (dict, type(None)),
}  # fmt: skip


def trainer_state_problem(path: Path, step: int | None = None) -> str | None:
    """What is wrong with a checkpoint's trainer_state.json, its global_step other than `step` (the
    folder's) among it; None also when there is none."""
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as error:
        return f"{path.name} is not readable JSON ({str(error).splitlines()[0]})"
    if not isinstance(state, dict):
        return f"{path.name} must hold a JSON object, not {type(state).__name__}"
    known = {field.name for field in dataclasses.fields(TrainerState)}  # this transformers' own
    unknown = sorted(set(state) - known)
    if unknown:
        return f"{path.name} has keys the Trainer does not know: {', '.join(unknown)}"
    for key, value in state.items():
        allowed = TRAINER_STATE_FIELDS.get(key, (object,))
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
            return (
                f"{path.name}: {key} is {value!r:.40}, not {' or '.join(kind.__name__ for kind in allowed)}"
            )
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            return f"{path.name}: {key} is {value}, below 0"
    if state.get("max_steps") and state.get("global_step", 0) > state["max_steps"]:
        return f"{path.name}: global_step {state['global_step']} is past max_steps {state['max_steps']}"
    if step is not None and state.get("global_step") != step:
        return f"{path.name}: global_step is {state.get('global_step')!r:.20}, the folder's name step {step}"
    return None


def swapped_to_nvme(checkpoint: Path) -> bool:
    """Whether DeepSpeed wrote this checkpoint's optimizer states as NVMe swap files (zero3_nvme):
    `global_stepN/offloaded_tensors/`, raw tensors that neither its loader nor zero_to_fp32 reads back
    as a whole (finetune/resume.py, finetune/export.py)."""
    return any(checkpoint.glob("global_step*/offloaded_tensors"))


def checkpoints_newest_first(output_dir: str | Path) -> list[Path]:
    found = []
    for path in Path(output_dir).glob(f"{CHECKPOINT_PREFIX}*"):
        match = CHECKPOINT_PATTERN.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found, reverse=True)]


def latest_good_checkpoint(output_dir: str | Path) -> Path | None:
    for checkpoint in checkpoints_newest_first(output_dir):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint
        logger.warning(f"finetune: skipping {checkpoint}: {problem}")
    return None


def checkpoint_to_resume(output_dir: str, resume: bool, resume_from: str | None) -> Path | None:
    """The checkpoint a run continues from: the one named, the newest good one, or none.

    `--resume` with no checkpoint yet starts from scratch, so one command serves a job's first
    start and its requeues.
    """
    if resume_from:
        path = Path(resume_from)
        problem = checkpoint_problem(path) if path.is_dir() else "no such folder"
        if problem:
            raise FinetuneError(f"--resume_from_checkpoint {resume_from}: {problem}")
        safe_unpickling.check_metadata_files(path)
        return path
    if not resume:
        return None
    checkpoint = latest_good_checkpoint(output_dir)
    if checkpoint is None:
        logger.warning(
            f"finetune: --resume: no complete checkpoint in {output_dir} yet, starting from scratch"
        )
    else:
        safe_unpickling.check_metadata_files(checkpoint)
    return checkpoint


def load_weights_only() -> None:
    """No pickle from a checkpoint folder runs code: every torch.load, ours or a library's, becomes
    weights-only, and DeepSpeed checkpoints can still be read: they pickle a few plain state classes.

    Found by loading every file of ZeRO-1/2/3 checkpoints with weights_only=True; each is a data
    holder restored from its __dict__, no code of the checkpoint's choosing. FSDP's distributed
    checkpoint metadata, which torch reads with plain pickle, is restricted too (finetune.safe_unpickling).
    """
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # torch refuses every load when both are set
    safe_unpickling.install()
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return
    torch.serialization.add_safe_globals([ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address])


@collective
def highest_on_any_rank(value: int, device: torch.device, group: dist.ProcessGroup | None = None) -> int:
    """The largest of every rank's value, on every rank. Collective (over `group`, on `device`)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    shared = torch.tensor([value], device=device)
    dist.all_reduce(shared, op=dist.ReduceOp.MAX, group=group)
    return int(shared.item())


class SaveAndStopOnSignal(TrainerCallback):
    """On SIGTERM or SIGUSR1, save a checkpoint at the next step boundary on all ranks, then stop.

    The signal may reach only some ranks, or each at another time, so at every step end the ranks
    agree (one all-reduce of the signal's number, between the hosts over gloo: no GPU wait) before any
    of them acts, and all name the same signal whichever rank got it first. A repeated stop signal is
    the same request: SLURM signals every process of a job, launcher included, and the launcher
    forwards its SIGTERM to the ranks, so each rank gets two at once. Ctrl-C (SIGINT, not handled
    here) still stops at once.

    Once the checkpoint is saved the ranks exit 75, and the first to go makes the launcher send
    SIGTERM to the others; a rank still on its way out would die of it (-15, or an abort in
    teardown) instead of exiting 75. So after a stop the stop signals are ignored, not restored.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self.stopped_at_step: int | None = None
        self._signal_number = 0
        self._previous: dict[int, Any] = {}
        self._group: dist.ProcessGroup | None = None

    def _handle(self, signum: int, frame: object) -> None:
        self._signal_number = self._signal_number or signum

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        if dist.is_available() and dist.is_initialized():
            self._group = host_group()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.received is not None:
            return
        number = highest_on_any_rank(self._signal_number, torch.device("cpu"), self._group)
        if number:
            self.received = signal.Signals(number).name
            self.stopped_at_step = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.received is None and self._signal_number:  # came after the last step's agreement
            self.received = signal.Signals(self._signal_number).name
            self.stopped_at_step = state.global_step
        for number, handler in self._previous.items():
            signal.signal(number, signal.SIG_IGN if self.received else handler)
