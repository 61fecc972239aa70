"""Fine-tune causal language models with transformers.Trainer under any accelerate/DeepSpeed profile."""

__version__ = "0.1.0"
