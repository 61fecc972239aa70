"""`python -m finetune` and the `finetune` command.

The command-line module imports transformers and accelerate (seconds): Ctrl-C meanwhile is one line
and exit 130, as during the package's own import (finetune/__init__.py), not a traceback. Output
piped into a reader that stops early (`finetune plan ... | head`) ends the command quietly, as a
process killed by SIGPIPE does (exit 141), not with a BrokenPipeError traceback.
"""

import os
import sys

INTERRUPTED_WHILE_STARTING = "finetune: interrupted while starting"


def console_main() -> int:
    try:
        from finetune.cli import main
    except KeyboardInterrupt:
        print(INTERRUPTED_WHILE_STARTING, file=sys.stderr)
        return 130
    try:
        return main()
    except BrokenPipeError:
        # what is still buffered would raise again at exit: stdout goes nowhere from here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # SIGPIPE


if __name__ == "__main__":
    raise SystemExit(console_main())
