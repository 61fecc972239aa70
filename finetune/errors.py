"""The one exception type for mistakes in what the user asked for."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

USAGE_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130  # the shell's code for a command stopped by Ctrl-C
RESUMABLE_EXIT_CODE = 75  # EX_TEMPFAIL: stopped on request with a checkpoint; run again with --resume


class FinetuneError(Exception):
    """Bad input (unknown name, impossible setting). Reported as one line, never as a traceback."""


class StoppedForResume(Exception):
    """Training stopped on a signal after saving a checkpoint: the job should be requeued."""


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """One line and an exit code instead of a traceback: bad input 2, stopped with a checkpoint 75,
    interrupted 130."""
    try:
        yield
    except FinetuneError as error:
        print(f"finetune: error: {error}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT_CODE) from None
    except StoppedForResume as stop:
        print(f"finetune: {stop}", file=sys.stderr)
        raise SystemExit(RESUMABLE_EXIT_CODE) from None
    except KeyboardInterrupt as interrupt:
        print(f"finetune: interrupted ({str(interrupt) or 'SIGINT'})", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
