"""The one exception type for mistakes in what the user asked for, and how it reaches the user.

A user error is reported once per run, not once per rank. Under `finetune run` (finetune/launch.py)
the ranks write the message to the file `$FINETUNE_ERROR_FILE` names and the launcher prints it; under a
bare `accelerate launch` rank 0 prints it and the other ranks stay silent. The rank is read from the
launcher's variable here, not from `Launch`: an error may come before the Launch exists, or from it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

USAGE_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130  # the shell's code for a command stopped by Ctrl-C
RESUMABLE_EXIT_CODE = 75  # EX_TEMPFAIL: stopped on request with a checkpoint; run again with --resume
DIVERGED_EXIT_CODE = 3  # the loss or gradients blew up: nothing was saved from the diverged weights
CHECK_FAILED_EXIT_CODE = 4  # `finetune doctor`: a check failed; its table says which and what to do
ERROR_FILE_VARIABLE = "FINETUNE_ERROR_FILE"
# How long a rank other than 0 waits before printing its error itself. Bad input fails every rank
# alike; the launcher stops the others as soon as rank 0 exits, so they never print. Only an error
# rank 0 does not share (it is busy elsewhere) outlives the wait and is printed by the rank that saw it.
OTHER_RANK_GRACE_S = 15.0


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type when it has none): libraries' messages run to
    many lines, and the user gets one."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def lines_joined(error: BaseException) -> str:
    """An error's message on one line, every line kept: for short messages whose facts follow their
    first line (TrainingArguments': "... but found" and the two strategies below it)."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__


class FinetuneError(Exception):
    """Bad input (unknown name, impossible setting). Reported as one line, never as a traceback."""


class OneLineArgumentErrors:
    """For argparse parsers: a mistake in the flags is one line, not the whole usage before it (134
    lines for run.py's); `--help` still prints the usage."""

    prog: str

    def error(self, message: str) -> NoReturn:
        raise FinetuneError(f"{message} (`{self.prog} --help` lists the flags)")


class Diverged(Exception):
    """The run diverged (finetune/divergence.py): the message names the step and the value. Every rank
    sees the same values and stops at the same step; rank 0 says so."""


class StoppedForResume(Exception):
    """Training stopped on a signal after saving a checkpoint: the job should be requeued."""


def report_user_error(message: str) -> None:
    """Print `finetune: error: ...` once for the whole job (see the module docstring)."""
    error_file = os.environ.get(ERROR_FILE_VARIABLE)
    if error_file:
        try:
            with open(error_file, "x", encoding="utf-8") as stream:
                stream.write(message + "\n")
            return
        except FileExistsError:  # another rank has already reported it
            return
        except OSError:
            pass  # no launcher to read it: print it as a bare launch does
    if int(os.environ.get("RANK", "0")) != 0:
        time.sleep(OTHER_RANK_GRACE_S)
    print(f"finetune: error: {message}", file=sys.stderr)


def reported_by_another_rank() -> str | None:
    """The error another rank of this job has reported (under `finetune run`), if any: a rank then
    fails in its next collective, and its own traceback says only that the other rank left."""
    error_file = os.environ.get(ERROR_FILE_VARIABLE)
    if not error_file:
        return None
    try:
        with open(error_file, encoding="utf-8") as stream:
            return stream.read().strip() or None
    except OSError:
        return None


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """One line and an exit code instead of a traceback: bad input 2, diverged 3, stopped with a
    checkpoint 75, interrupted 130."""
    try:
        yield
    except FinetuneError as error:
        report_user_error(str(error))
        raise SystemExit(USAGE_EXIT_CODE) from None
    except Diverged as diverged:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"finetune: {diverged}", file=sys.stderr)
        raise SystemExit(DIVERGED_EXIT_CODE) from None
    except StoppedForResume as stop:  # every rank stopped at the same step: one line says so
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"finetune: {stop}", file=sys.stderr)
        raise SystemExit(RESUMABLE_EXIT_CODE) from None
    except KeyboardInterrupt as interrupt:
        if reported_by_another_rank() is not None:  # stopped by the launcher after that rank's error
            raise SystemExit(USAGE_EXIT_CODE) from None
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"finetune: interrupted ({str(interrupt) or 'SIGINT'})", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
    except Exception:
        if reported_by_another_rank() is not None:  # the launcher prints that rank's line
            raise SystemExit(USAGE_EXIT_CODE) from None
        raise
