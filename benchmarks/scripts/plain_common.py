"""What the plain-Trainer baselines of issue 17 (plain_instruction.py, plain_lora.py) share: the step
timer and token counts that make their rates count what finetune's ThroughputCallback counts, the
TrainingArguments a tutorial would write, the result JSON, and the TINY=1 shrink for a CPU dry run.

The timer is plain_trainer.py's (synchronized step ends, the first WARMUP steps left out); the token
counts come from a forward pre-hook on the model, as finetune's do, because padded batches differ in
length: rates are tokens over the timed steps' summed time. None of this is a library facility.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from itertools import chain
from typing import Any

import torch
from datasets import Dataset, load_dataset
from transformers import PreTrainedTokenizerBase, Trainer, TrainerCallback, TrainingArguments

IGNORE_INDEX = -100
TINY = os.environ.get("TINY") == "1"  # CPU dry run: fp32, 128-token blocks, one warm-up step
BLOCK = 128 if TINY else 1024
WARMUP = 1 if TINY else 5
TINY_GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 2}


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer(TrainerCallback):
    """Times steps after WARMUP and counts, per timed step, the tokens the model computed on, the real
    (non-padding) ones and the ones the loss is on (labels after each row's first that are not -100)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[tuple[int, int, int]] = []
        self.pending = [0, 0, 0]
        self.last: float | None = None

    def count(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training:
            return
        ids, mask, labels = kwargs["input_ids"], kwargs.get("attention_mask"), kwargs["labels"]
        real = int(mask.sum()) if mask is not None else ids.numel()
        trained = int((labels[..., 1:] != IGNORE_INDEX).sum())
        self.pending = [a + b for a, b in zip(self.pending, (ids.numel(), real, trained), strict=True)]

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.register_forward_pre_hook(self.count, with_kwargs=True)

    def on_step_end(self, args, state, control, **kwargs):
        synchronize()
        now = time.perf_counter()
        if self.last is not None and state.global_step > WARMUP:
            self.times.append(now - self.last)
            self.counts.append(tuple(self.pending))
        self.pending = [0, 0, 0]
        self.last = now


def training_arguments(batch: int, steps: int, output_dir: str) -> TrainingArguments:
    """bf16 on the GPU (fp32 under TINY, on the CPU), the Trainer's defaults otherwise."""
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        max_steps=steps,
        bf16=not TINY,
        use_cpu=not torch.cuda.is_available(),
        logging_steps=1 if TINY else 10,
        save_strategy="no",
        report_to="none",
    )


def write_result(trainer: Trainer, timer: StepTimer, model_dir: str, batch: int, output: str) -> dict:
    """plain_trainer.py's keys, and the token rates finetune's run summary names the same way."""
    seconds = sum(timer.times)
    computed, real, trained = (sum(column) for column in zip(*timer.counts, strict=True))
    cuda = torch.cuda.is_available()
    result = {
        "model": model_dir,
        "processes": trainer.args.world_size,
        "micro_batch": batch,
        "block_size": BLOCK,
        "steps_timed": len(timer.times),
        "step_time_median_s": statistics.median(timer.times),
        "tokens_per_second": real / seconds,
        "trained_tokens_per_second": trained / seconds,
        "computed_tokens_per_second": computed / seconds,
        "computed_tokens_per_step": computed / len(timer.times),
        "padding_share": 1 - real / computed,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "loss_curve": [
            {"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e
        ],
    }
    if trainer.is_world_process_zero():
        print("PLAIN", json.dumps(result))
        with open(output, "w") as file:
            json.dump(result, file, indent=1)
    return result


def wikitext_blocks(tokenizer: PreTrainedTokenizerBase, block: int = BLOCK) -> Dataset:
    """WikiText-2's validation split from $FINETUNE_DATA_DIR (what finetune's default dataset trains on
    offline) in full blocks of `block` tokens, labels = inputs, grouped as run_clm.py groups text."""
    data_dir = os.path.join(os.environ["FINETUNE_DATA_DIR"], "wikitext-2-v1")
    raw = load_dataset("text", data_files={"train": f"{data_dir}/wiki.valid.tokens"}, keep_linebreaks=True)
    tokens = raw.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])

    def group_texts(examples: dict) -> dict:
        joined = {key: list(chain(*examples[key])) for key in examples}
        length = len(joined["input_ids"]) // block * block
        result = {key: [t[i : i + block] for i in range(0, length, block)] for key, t in joined.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    return tokens.map(group_texts, batched=True, batch_size=10_000)["train"]
