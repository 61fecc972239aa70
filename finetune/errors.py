"""The one exception type for mistakes in what the user asked for."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

USAGE_EXIT_CODE = 2


class FinetuneError(Exception):
    """Bad input (unknown name, impossible setting). Reported as one line, never as a traceback."""


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Turn a FinetuneError into `finetune: error: ...` on stderr and exit code 2."""
    try:
        yield
    except FinetuneError as error:
        print(f"finetune: error: {error}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT_CODE) from None
