"""`python -m finetune` and the `finetune` command.

The command-line module imports transformers and accelerate (seconds): Ctrl-C meanwhile is one line
and exit 130, as during the package's own import (finetune/__init__.py), not a traceback.
"""

import sys

INTERRUPTED_WHILE_STARTING = "finetune: interrupted while starting"


def console_main() -> int:
    try:
        from finetune.cli import main
    except KeyboardInterrupt:
        print(INTERRUPTED_WHILE_STARTING, file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    raise SystemExit(console_main())
