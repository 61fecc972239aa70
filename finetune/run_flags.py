"""run.py's model and data flags, declared once as dataclasses, and other commands' parsers built from them.

Kept apart from finetune/arguments.py (TrainingArguments and its flags) so that every `finetune`
command can declare the run flags it shares (`finetune plan --peft`, `finetune eval --dataset`) from
these declarations, with their types, defaults, choices and help, without importing transformers'
training classes. As TRL's `make_parser(subparsers)`: one declaration for the script and the CLI.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from finetune.adapters import ALL_LINEAR, DEFAULT_LORA_DROPOUT, PEFT_METHODS, target_modules
from finetune.data_formats import DATA_FORMATS
from finetune.errors import FinetuneError

FRACTION_OF_STEPS = "below 1: a fraction of the steps"
# The smallest value of each numeric run flag (model, data and training flags alike), and what a value
# there means where it needs saying. The dataclasses take them all without a word; below these, torch,
# datasets or the Trainer fail with a traceback once data and model are built (worker counts, AdamW's
# epsilon, sample counts), or misuse them: a negative weight decay, which the Trainer passes per
# parameter group where AdamW never checks it, pushes weights away from zero; a negative watchdog ends
# the run at its first step as hung.
LOWEST_VALUES: dict[str, tuple[int, str]] = {
    "lora_rank": (1, ""),
    "max_train_samples": (1, ""),
    "max_eval_samples": (1, ""),
    "preprocessing_num_workers": (0, "0: tokenize in the training process"),
    "per_device_train_batch_size": (1, ""),
    "per_device_eval_batch_size": (1, ""),
    "eval_accumulation_steps": (1, ""),
    "gradient_accumulation_steps": (1, ""),
    "global_batch_size": (1, ""),
    "fsdp_blocks_per_unit": (1, ""),
    "fsdp_prefetch": (0, "0: FSDP2's implicit prefetch"),
    "sequence_parallel": (1, ""),
    "throughput_warmup_steps": (0, ""),
    "gc_interval": (0, "0: automatic collection"),
    "dataloader_num_workers": (0, "0: load in the training process"),
    "dataloader_prefetch_factor": (1, ""),
    "watchdog_s": (0, "0: off"),
    "weight_decay": (0, ""),
    "adam_epsilon": (0, ""),
    "max_grad_norm": (0, "0: no clipping"),
    "neftune_noise_alpha": (0, ""),
    "warmup_steps": (0, FRACTION_OF_STEPS),
    "logging_steps": (0, FRACTION_OF_STEPS),
    "eval_steps": (0, FRACTION_OF_STEPS),
    "save_steps": (0, FRACTION_OF_STEPS),
}
FLAG_NAMES = {"per_device_train_batch_size": "--batch_size"}  # the documented alias


def check_lowest_values(arguments: object) -> None:
    """One dataclass's flags of the table above (each class declares some of them)."""
    for name, (lowest, note) in LOWEST_VALUES.items():
        value = getattr(arguments, name, None)
        if value is not None and value < lowest:
            flag = FLAG_NAMES.get(name, f"--{name}")
            bound = "at least 1" if lowest == 1 else "0 or more"
            raise FinetuneError(f"{flag} must be {bound}{f' ({note})' if note else ''}, got {value}")


@dataclass
class ModelArguments:
    model: str = field(
        default="gpt2",
        metadata={
            "aliases": ["--model_name_or_path"],
            "help": "Hub name, GPT-2 size alias (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2) or a "
            "local save_pretrained folder. Looked up locally, then in $FINETUNE_DATA_DIR, then on the Hub.",
        },
    )
    from_scratch: bool = field(
        default=False,
        metadata={
            "help": "Build the architecture from its config with random weights instead of loading weights."
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": 'Comma-separated config changes, as in run_clm.py: "n_layer=2,n_embd=64".'},
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer name or folder (default: the model's)."}
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow model code from the Hub to run. Off unless you trust the repository."},
    )
    attn_implementation: str = field(
        default="sdpa", metadata={"help": "Attention kernel: sdpa (PyTorch scaled-dot-product), eager, ..."}
    )
    peft: str | None = field(
        default=None,
        metadata={
            "help": "Train adapters instead of every weight (docs/lora.md): lora, or dora (weight-decomposed "
            "LoRA). The base model is frozen; checkpoints and the saved model hold only the adapters.",
            "choices": list(PEFT_METHODS),
        },
    )
    lora_rank: int = field(default=16, metadata={"help": "--peft: rank r of each adapter."})
    lora_alpha: float = field(
        default=32, metadata={"help": "--peft: scaling numerator; the update is scaled by alpha / rank."}
    )
    lora_dropout: float = field(
        default=DEFAULT_LORA_DROPOUT, metadata={"help": "--peft: dropout on the adapters' input."}
    )
    lora_target_modules: str = field(
        default=ALL_LINEAR,
        metadata={
            "help": "--peft: all-linear (every linear and GPT-2 Conv1D layer but the output layer) or "
            "comma-separated module names, e.g. q_proj,v_proj or c_attn."
        },
    )

    def __post_init__(self) -> None:
        check_lowest_values(self)
        if not self.peft:
            return
        if self.from_scratch:
            raise FinetuneError(
                f"--peft {self.peft} trains adapters on top of loaded weights, and --from_scratch has none "
                "to load (nor saves them): save the initialised model first and pass its folder as --model"
            )
        if not self.lora_alpha > 0:  # 0 scales every update away: the adapters would train nothing
            raise FinetuneError(f"--lora_alpha must be positive, got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            raise FinetuneError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not target_modules(self.lora_target_modules):
            raise FinetuneError("--lora_target_modules is empty: give all-linear or module names")

    def folders_read(self) -> dict[str, str | None]:
        """The folders the run reads by flag, which --overwrite_output_dir must never delete."""
        return {"--model": self.model, "--tokenizer": self.tokenizer}


@dataclass
class DataArguments:
    dataset: str = field(
        default="wikitext-2-raw-v1",
        metadata={
            "aliases": ["--dataset_name"],
            "help": "wikitext-2-raw-v1, wikitext-103-raw-v1, a Hub dataset, or a local "
            ".txt/.jsonl/.json/.csv/.parquet file or folder of them.",
        },
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    text_column: str = field(default="text", metadata={"help": "Column that holds the text."})
    block_size: int | None = field(
        default=None,
        metadata={"help": "Tokens per training sample (default: the model's context, at most 1024)."},
    )
    packing: bool = field(
        default=True,
        metadata={
            "help": "Concatenate texts into full blocks (no padding); pack instruction examples into blocks "
            "they cannot attend across. --no_packing pads/truncates each text or example."
        },
    )
    data_format: str = field(
        default="auto",
        metadata={
            "help": "auto: detected from the columns (docs/instruction-data.md); text, prompt_completion, "
            "instruction, question_answer or messages to choose.",
            "choices": list(DATA_FORMATS),
        },
    )
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "Jinja chat template file for messages data (default: the tokenizer's own, else "
            "finetune/templates/default_chat.jinja); saved with the model."
        },
    )
    train_on_prompt: bool = field(
        default=False,
        metadata={"help": "Instruction and chat data: train on prompt tokens too, not only on the answers."},
    )
    validation_split_percentage: int = field(
        default=5,
        metadata={
            "help": "Share of train carved out for validation when the dataset has no validation split."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"aliases": ["--num_samples"], "help": "Keep only this many training blocks."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many evaluation blocks."}
    )
    eval_test_split: bool = field(
        default=False,
        metadata={"help": "Also evaluate on the test split at the end (test_loss and test_perplexity)."},
    )
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={"help": "Processes for tokenization (default: one per 2 cores on large datasets)."},
    )

    def __post_init__(self) -> None:
        if self.block_size is not None:
            check_block_size(self.block_size)
        check_lowest_values(self)
        if not 0 < self.validation_split_percentage < 100:
            raise FinetuneError(
                "--validation_split_percentage must be between 1 and 99, "
                f"got {self.validation_split_percentage}"
            )


def check_block_size(block_size: int) -> None:
    """A block trains on its tokens' next tokens: one token predicts nothing."""
    if block_size < 2:
        raise FinetuneError(f"--block_size must be at least 2 tokens, got {block_size}")


def add_run_flags(parser: argparse.ArgumentParser, declared_by: type, names: tuple[str, ...]) -> None:
    """Declare run.py's flags `names` on another command's parser exactly as run.py declares them
    (HfArgumentParser reads the dataclass; its argparse actions are added to `parser`)."""
    from transformers.hf_argparser import HfArgumentParser

    actions = {action.dest: action for action in HfArgumentParser(declared_by)._actions}
    for name in names:
        parser._add_action(actions[name])
