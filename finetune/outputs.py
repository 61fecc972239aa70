"""An output_dir belongs to one run: refused if it holds another run's results, locked while a run
trains in it, and never outlived by the ranks that train in it.

- Results of an earlier run (summary, checkpoints, model, TensorBoard logs) are kept unless the user
  continues that run (`--resume`) or replaces it (`--overwrite_output_dir`, which says what it replaces
  and moves it into `.replaced/` before the data is read, so no earlier checkpoint can later be mixed
  with the new run's; they are deleted at the new run's first step and put back if it stops before
  it: a misspelt dataset must not cost the results it was meant to replace).
- Rank 0 holds an `flock` on `output_dir/.finetune.lock` (host, pid and start time inside) for as long
  as it lives, so a second run into the folder, `--resume` included, fails at once naming the holder.
  The kernel drops the lock when its process dies, however it dies; a lock file whose pid is gone from
  this host is taken over too (its flock may live on in a forked child).
- Each launched rank sends itself SIGTERM when its launcher dies, so a `kill -9` of `accelerate launch`
  ends in the usual save-and-stop instead of ranks training on unsupervised.
"""

from __future__ import annotations

import atexit
import datetime
import fcntl
import json
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.utils import logging

from finetune.errors import FinetuneError
from finetune.processes import process_is_gone
from finetune.run_folder import ADAPTER_CARD, LOCK_FILE, REPLACED_DIR, RESULT_PATTERNS, SUMMARY_FILE

if TYPE_CHECKING:
    from finetune.arguments import FinetuneTrainingArguments
    from finetune.launched import Launch

logger = logging.get_logger("finetune")

LAUNCHER_POLL_S = 1.0


@dataclass(frozen=True)
class Holder:
    """Who holds an output_dir: enough to find the process, and to tell it from a later one with its pid."""

    host: str
    pid: int
    started_at: str
    process_started: float

    @classmethod
    def this_process(cls) -> Holder:
        started = psutil.Process().create_time()
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=datetime.datetime.fromtimestamp(started).astimezone().isoformat(timespec="seconds"),
            process_started=started,
        )

    def is_gone(self) -> bool:
        return process_is_gone(self.host, self.pid, self.process_started)

    def __str__(self) -> str:
        return f"host {self.host}, pid {self.pid}, started {self.started_at}"


def read_holder(lock_path: Path) -> Holder | None:
    try:
        return Holder(**json.loads(lock_path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


class OutputDirLock:
    """An exclusive `flock` on `output_dir/.finetune.lock`, held by this process until `release`.

    Written by hand: filelock and friends wait or fail without saying who holds the lock, and none
    recognises a holder that is gone while its lock lives on.
    """

    def __init__(self, output_dir: Path) -> None:
        self.path = output_dir / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        for _ in range(3):  # each retry follows a lock file that was replaced or removed under us
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = read_holder(self.path)
                if holder is None or not holder.is_gone():
                    who = holder or "a process that has not written its name yet"
                    raise FinetuneError(
                        f"--output_dir {self.path.parent} is in use by another run ({who}; lock file "
                        f"{self.path}): wait for it to end or stop it"
                    ) from None
                logger.warning(f"finetune: taking over {self.path} from a run that is gone ({holder})")
                self.path.unlink(missing_ok=True)
                continue
            if not self._is_current(fd):
                os.close(fd)
                continue
            previous = read_holder(self.path)
            if previous is not None:
                logger.warning(
                    f"finetune: taking over {self.path} from a run that did not release it ({previous})"
                )
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(asdict(Holder.this_process())) + "\n").encode())
            self.fd = fd
            return
        raise FinetuneError(f"cannot lock {self.path}: it keeps being replaced by another process")

    def _is_current(self, fd: int) -> bool:
        """Whether the file locked is still the one at the path (another run may have taken it over)."""
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if self.fd is None:
            return
        if self._is_current(self.fd):
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None


_held: dict[Path, OutputDirLock] = {}


@atexit.register
def _release_all() -> None:
    for lock in _held.values():
        lock.release()
    _held.clear()


def lock_output_dir(output_dir: Path) -> OutputDirLock:
    """This process's lock on output_dir, taken once (a second call in one process reuses it)."""
    key = output_dir.resolve()
    if key not in _held:
        lock = OutputDirLock(output_dir)
        lock.acquire()
        _held[key] = lock
    return _held[key]


def unlock_output_dir(output_dir: Path) -> None:
    lock = _held.pop(output_dir.resolve(), None)
    if lock is not None:
        lock.release()


def earlier_results(output_dir: Path) -> list[Path]:
    """What an earlier run left in output_dir. A summary of a run that failed or was interrupted before
    its first step is no result: re-running after fixing a typo in a flag, or after a Ctrl-C during the
    data preparation, must not need --overwrite_output_dir."""
    found = {path for pattern in RESULT_PATTERNS for path in output_dir.glob(pattern)}
    if (output_dir / "adapter_config.json") in found and (output_dir / ADAPTER_CARD).is_file():
        found.add(output_dir / ADAPTER_CARD)
    if found == {output_dir / SUMMARY_FILE} and stopped_before_training(output_dir / SUMMARY_FILE):
        return []
    return sorted(found)


def stopped_before_training(summary: Path) -> bool:
    try:
        fields = json.loads(summary.read_text())
    except (OSError, ValueError):
        return False
    stopped = isinstance(fields, dict) and fields.get("status") in ("failed", "interrupted")
    return stopped and not fields.get("steps")


def remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def refuse_deleting_inputs(output_dir: Path, inputs: dict[str, str | None]) -> None:
    """--overwrite_output_dir never deletes what the run reads: a --model or --tokenizer folder that is
    output_dir or lies inside it (`--model M --output_dir M`)."""
    folder = output_dir.resolve()
    for flag, value in inputs.items():
        if value and Path(value).exists() and Path(value).resolve().is_relative_to(folder):
            raise FinetuneError(
                f"--overwrite_output_dir would delete {flag} {value}: it lies in --output_dir {output_dir}; "
                "choose another output_dir"
            )


def check_claimable(
    output_dir: Path, resume: bool, overwrite: bool, inputs: dict[str, str | None] | None = None
) -> list[Path]:
    """What an earlier run left in output_dir that this run may replace (none to keep or resume);
    refused where it may not. Reads only: `finetune run` asks it before it writes its launch folder
    there, rank 0 again under the lock."""
    found = results_to_judge(output_dir)
    if not found or resume:
        return []
    names = ", ".join(path.name for path in found)
    if not overwrite:
        raise FinetuneError(
            f"--output_dir {output_dir} holds another run's results ({names}): pass --resume to continue "
            "that run, --overwrite_output_dir to delete them and start anew, or choose another folder"
        )
    refuse_deleting_inputs(output_dir, inputs or {})
    return found


def results_to_judge(output_dir: Path) -> list[Path]:
    """An earlier run's results in output_dir, with those a killed --overwrite_output_dir run set aside:
    the claim puts them back before it judges the folder, so every check ahead of it judges them too."""
    if not output_dir.is_dir():
        return []
    return sorted([*earlier_results(output_dir), *set_aside_results(output_dir)], key=lambda path: path.name)


def claim_on_main(
    output_dir: Path, resume: bool, overwrite: bool, inputs: dict[str, str | None] | None = None
) -> None:
    """Lock output_dir, then refuse, keep or set aside what an earlier run left in it (never `inputs`,
    the folders the run reads by flag)."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FinetuneError(f"--output_dir {output_dir}: cannot create it ({error.strerror})") from None
    lock_output_dir(output_dir)
    # a run killed (SIGKILL, a lost node) before its first step could not put them back itself
    put_back(output_dir, "an earlier run set them aside and ended before its first step")
    try:
        found = check_claimable(output_dir, resume, overwrite, inputs)
    except FinetuneError:
        unlock_output_dir(output_dir)
        raise
    if not found:
        return
    names = ", ".join(path.name for path in found)
    logger.warning(
        f"finetune: --overwrite_output_dir: replacing {names} in {output_dir} (deleted at the first "
        "training step, put back if the run stops before it)"
    )
    set_aside(output_dir, found)


def set_aside(output_dir: Path, found: list[Path]) -> None:
    """One rename per result into output_dir/.replaced/: nothing is copied, and the names the new run
    writes (checkpoint-N, run_summary.json) are free."""
    aside = output_dir / REPLACED_DIR
    aside.mkdir()
    for path in found:
        path.rename(aside / path.name)


def put_back(output_dir: Path, why: str) -> None:
    """What set_aside moved, back in place of whatever the stopped run wrote under the same names
    before its first step (its summary, an empty TensorBoard folder); said with `why`."""
    names = []
    for path in set_aside_results(output_dir):
        target = output_dir / path.name
        if target.exists() or target.is_symlink():
            remove([target])
        path.rename(target)
        names.append(path.name)
    if (output_dir / REPLACED_DIR).is_dir():
        (output_dir / REPLACED_DIR).rmdir()
    if names:
        logger.warning(
            f"finetune: --overwrite_output_dir: {why}; {', '.join(names)} put back in {output_dir}"
        )


def set_aside_results(output_dir: Path) -> list[Path]:
    """Results an --overwrite_output_dir run set aside and has not yet replaced by training a step."""
    aside = output_dir / REPLACED_DIR
    return sorted(aside.iterdir()) if aside.is_dir() else []


@contextmanager
def earlier_results_back_unless_trained(output_dir: Path, is_main: bool) -> Iterator[None]:
    """Around the run: if it stops before its first step, for a bad flag found once the data or model
    is read, an out-of-memory at the first step or a Ctrl-C, what --overwrite_output_dir set aside is
    put back, over this run's own summary."""
    try:
        yield
    except BaseException:
        if is_main:
            put_back(output_dir, "the run stopped before its first step")
        raise


class DeleteReplacedAtFirstStep(TrainerCallback):
    """The earlier results --overwrite_output_dir set aside go once the new run has trained a step:
    from then on the folder is the new run's, and their disk space is free before its first checkpoint."""

    def __init__(self, output_dir: str | Path) -> None:
        self.aside = Path(output_dir) / REPLACED_DIR
        self.done = False

    def on_step_end(self, args, state, control, **kwargs):
        if not self.done and state.is_world_process_zero and self.aside.exists():
            shutil.rmtree(self.aside)
        self.done = True


def die_with_launcher(launch: Launch) -> None:
    """A launched rank gets one SIGTERM when the process that started it dies, even by SIGKILL.

    torchelastic starts the ranks from the `accelerate launch` process itself, so that is the parent.
    A thread watches for the rank being re-parented, written by hand because the kernel's
    PR_SET_PDEATHSIG fires once per thread of a dying multi-threaded launcher, and one signal is what
    the save-and-stop needs. Only ranks a launcher started watch: a `python finetune/run.py` under
    nohup must outlive its shell.
    """
    if not launch.by_launcher:
        return
    launcher = os.getppid()
    if launcher == 1:
        raise FinetuneError("the launcher that started this rank has exited")

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(LAUNCHER_POLL_S)
        logger.warning(f"finetune: the launcher (pid {launcher}) has exited: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="finetune-launcher-watch", daemon=True).start()


def share_from_main(message: str | None) -> str | None:
    """Rank 0's verdict on every rank (a broadcast, so the others also wait for its clean-up)."""
    if not (dist.is_available() and dist.is_initialized()):
        return message
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def claim_output_dir(
    args: FinetuneTrainingArguments, launch: Launch, inputs: dict[str, str | None] | None = None
) -> None:
    """Before data or model are built: make this run the only owner of its output_dir, on every rank.

    Rank 0 decides; every rank stops with the same one-line error when it refuses. `inputs`: the
    folders the run reads by flag ({"--model": ...}), which --overwrite_output_dir must not delete.
    """
    die_with_launcher(launch)
    verdict = None
    if args.process_index == 0:
        try:
            claim_on_main(
                Path(args.output_dir),
                args.resumes_a_run,
                args.overwrite_output_dir,
                inputs,
            )
        except FinetuneError as error:
            verdict = str(error)
        except OSError as error:
            verdict = f"--output_dir {args.output_dir}: {error}"
    verdict = share_from_main(verdict)
    if verdict is not None:
        raise FinetuneError(verdict)
