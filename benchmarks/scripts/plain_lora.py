"""The LoRA baseline of issue 17: a plain transformers.Trainer with peft's LoRA, as peft's guides write it.

The model is loaded with `from_pretrained` as saved (make_llama.py saves fp32 weights), then
`get_peft_model` with r=16, alpha 32, dropout 0.05 on every linear layer but the output layer
("all-linear"): finetune's `--peft lora` defaults. bf16 autocast, SDPA attention, the Trainer's default
optimizer, no torch.compile. The text is what finetune's default dataset trains on offline and
plain_trainer.py reads: WikiText-2's validation split in full 1024-token blocks. Rates are over the
steps after warm-up (plain_common.py); peak memory is the GPU's allocated peak.
usage: python benchmarks/scripts/plain_lora.py MODEL_DIR BATCH STEPS OUTPUT_JSON
(TINY=1: 128-token blocks, fp32, on the CPU; make_llama.py's TINY model)
"""

import os
import sys
from itertools import chain

from datasets import load_dataset
from peft import LoraConfig, get_peft_model
from plain_common import BLOCK, StepTimer, training_arguments, write_result
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, default_data_collator

model_dir, batch, steps, output = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
model = get_peft_model(model, lora)
model.print_trainable_parameters()
data_dir = os.path.join(os.environ["FINETUNE_DATA_DIR"], "wikitext-2-v1")
raw = load_dataset("text", data_files={"train": f"{data_dir}/wiki.valid.tokens"}, keep_linebreaks=True)
tokens = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])


def group_texts(examples: dict, block: int = BLOCK) -> dict:
    joined = {k: list(chain(*examples[k])) for k in examples}
    length = len(joined["input_ids"]) // block * block
    result = {k: [t[i : i + block] for i in range(0, length, block)] for k, t in joined.items()}
    result["labels"] = result["input_ids"].copy()
    return result


blocks = tokens.map(group_texts, batched=True, batch_size=10_000)["train"]
timer = StepTimer()
args = training_arguments(batch, steps, "/tmp/plain_lora")
trainer = Trainer(
    model=model, args=args, train_dataset=blocks, data_collator=default_data_collator, callbacks=[timer]
)
trainer.train()
write_result(trainer, timer, model_dir, batch, output)
