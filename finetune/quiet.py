"""Library noise that says nothing about the run, filtered once at import, each with why.

Everything else a library prints stays: a filter here names the exact message, never a whole logger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

import torch

# torchao (imported by transformers' quantizers when installed) tries its optional fused kernels on
# import and logs every one this machine's CUDA cannot load; only --fp8 uses torchao, and it fails
# there in its own words.
TORCHAO_OPTIONAL_KERNELS = ("torchao", "Failed to load ")
# torchao registers its enums with torch's pytree, which torch now deprecates (a torchao matter).
PYTREE_ENUM_DEPRECATION = ("torch.utils._pytree", "is an Enum subclass and is now natively supported")
# transformers warns when a batch holds the pad token without an attention mask. finetune's collators
# pass a mask wherever they pad; packed blocks separate their examples by position ids instead, and
# GPT-2's pad token is its EOS, which ends every answer. Training leaves the check out
# (converters.without_padding_check); `finetune evaluate` on a saved model's packed blocks still runs it.
PADDING_WITHOUT_MASK = ("transformers.modeling_utils", "We strongly recommend passing in an `attention_mask`")
# transformers says how it draws resized embedding rows; run.py's own line says they were resized, by
# how many tokens and to how many rows, and the docstring of models.resize_to_tokenizer how.
MEAN_RESIZING = ("transformers.modeling_utils", "will be initialized from a multivariate normal distribution")
# Dynamo does not trace the profiler labels that FSDP2's and DeepSpeed's hooks put around their work
# inside a compiled region, and says so once per process: about profiling, not about the run.
DYNAMO_PROFILER_LABELS = ("torch._dynamo.variables.ctx_manager", "Profiler record function")
# DeepSpeed calls torch.distributed's old collective names (a DeepSpeed matter), and torch warns at
# every call: 80 lines in a 20-step ZeRO-3 run.
DEEPSPEED_COLLECTIVE_NAMES = (
    r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
)


# DeepSpeed prints (not logs) a line per process whenever it loads an op it compiled, on every run
# (its shared-memory collectives on CPU, CPU Adam under offload): finetune says before the first
# build that one is coming, which is the moment a user needs to know.
DEEPSPEED_OP_LOADED = re.compile(r"DeepSpeed \S+ built successfully")


class WithoutMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def silence_known_noise() -> None:
    for logger_name, text in (
        TORCHAO_OPTIONAL_KERNELS,
        PYTREE_ENUM_DEPRECATION,
        PADDING_WITHOUT_MASK,
        MEAN_RESIZING,
        DYNAMO_PROFILER_LABELS,
    ):
        logging.getLogger(logger_name).addFilter(WithoutMessage(text))
    warnings.filterwarnings("ignore", message=DEEPSPEED_COLLECTIVE_NAMES, category=FutureWarning)
    # Without an accelerator DeepSpeed falls back to its CPU one and says so on every import (in
    # commands that do not train too): naming that accelerator makes the same choice without the line.
    # Here, at the package's import, it comes before anything of finetune's imports DeepSpeed.
    if not torch.accelerator.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


class WithoutPrintedLines:
    """stdout less the lines `print` writes that match `pattern` (print writes a line, then its end).

    Everything else passes through at once, unbuffered: progress bars' carriage returns included.
    Written by hand: neither logging nor warnings reach a library's bare print.
    """

    def __init__(self, stream: TextIO, pattern: re.Pattern[str]) -> None:
        self.stream, self.pattern, self.dropping_line_end = stream, pattern, False

    def write(self, text: str) -> int:
        if self.pattern.fullmatch(text):
            self.dropping_line_end = True
            return len(text)
        if self.dropping_line_end and text == "\n":
            self.dropping_line_end = False
            return len(text)
        self.dropping_line_end = False
        return self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def without_printed_lines(pattern: re.Pattern[str]) -> Iterator[None]:
    original = sys.stdout
    sys.stdout = WithoutPrintedLines(original, pattern)
    try:
        yield
    finally:
        sys.stdout = original
