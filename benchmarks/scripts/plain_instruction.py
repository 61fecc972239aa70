"""The baseline of issue 17 for instruction data: GSM8K with a plain transformers.Trainer, as a user
writes it without a fine-tuning framework.

Each problem is one example, `question + "\\n"` then `answer + EOS` (finetune's question/answer format,
docs/instruction-data.md), the question's tokens labelled -100; every batch is padded to its longest
example by `DataCollatorForSeq2Seq` (the pad token is EOS, as GPT-2 has none). Random init from the
config (dropout 0.1), bf16, SDPA attention, the Trainer's default optimizer, no torch.compile. Rates
are over the steps after warm-up (plain_common.py): real (non-padding) tokens/s, answer tokens/s,
computed tokens/s and the padding share of the computed tokens.
usage: python benchmarks/scripts/plain_instruction.py MODEL_DIR BATCH STEPS OUTPUT_JSON
(TINY=1: 2 layers of width 64, 128-token examples, fp32, on the CPU)
"""

import os
import sys

from datasets import load_dataset
from plain_common import BLOCK, IGNORE_INDEX, TINY, TINY_GPT2, StepTimer, training_arguments, write_result
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer

model_dir, batch, steps, output = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
tokenizer.pad_token = tokenizer.eos_token
config = AutoConfig.from_pretrained(model_dir, **(TINY_GPT2 if TINY else {}))
model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
model.config.pad_token_id = tokenizer.pad_token_id
data_file = os.path.join(os.environ["FINETUNE_DATA_DIR"], "gsm8k", "train.jsonl")
raw = load_dataset("json", data_files={"train": data_file})["train"]


def encode(row: dict) -> dict:
    prompt = tokenizer(row["question"] + "\n", add_special_tokens=False)["input_ids"]
    answer = tokenizer(row["answer"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    ids = (prompt + answer)[:BLOCK]
    labels = ([IGNORE_INDEX] * len(prompt) + answer)[:BLOCK]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}


examples = raw.map(encode, remove_columns=raw.column_names)
timer = StepTimer()
args = training_arguments(batch, steps, "/tmp/plain_instruction")
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=examples,
    data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX),
    callbacks=[timer],
)
trainer.train()
write_result(trainer, timer, model_dir, batch, output)
