"""Fine-tune causal language models with transformers.Trainer under any accelerate/DeepSpeed profile."""

__version__ = "0.1.0"

import sys

from finetune.startup_environment import set_startup_environment

set_startup_environment()  # before torch loads (the next import loads it)
try:
    from finetune.quiet import silence_known_noise  # before any library logs at import; imports torch

    silence_known_noise()
except KeyboardInterrupt:  # Ctrl-C during the seconds torch takes to import: one line, not a traceback
    print("finetune: interrupted while starting", file=sys.stderr)
    raise SystemExit(130) from None
