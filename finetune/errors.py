"""The one exception type for mistakes in what the user asked for."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

USAGE_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130  # the shell's code for a command stopped by Ctrl-C


class FinetuneError(Exception):
    """Bad input (unknown name, impossible setting). Reported as one line, never as a traceback."""


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """A FinetuneError becomes `finetune: error: ...` and exit code 2; Ctrl-C or SIGTERM exit code 130."""
    try:
        yield
    except FinetuneError as error:
        print(f"finetune: error: {error}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT_CODE) from None
    except KeyboardInterrupt as interrupt:
        print(f"finetune: interrupted ({interrupt or 'SIGINT'})", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
