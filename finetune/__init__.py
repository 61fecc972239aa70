"""Fine-tune causal language models with transformers.Trainer under any accelerate/DeepSpeed profile."""

__version__ = "0.1.0"

from finetune.quiet import silence_known_noise  # before any library logs at import

silence_known_noise()
