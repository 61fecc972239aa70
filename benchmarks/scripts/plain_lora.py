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

import sys

from peft import LoraConfig, get_peft_model
from plain_common import StepTimer, training_arguments, wikitext_blocks, write_result
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, default_data_collator

model_dir, batch, steps, output = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
model = get_peft_model(model, lora)
model.print_trainable_parameters()
blocks = wikitext_blocks(tokenizer)
timer = StepTimer()
args = training_arguments(batch, steps, "/tmp/plain_lora")
trainer = Trainer(
    model=model, args=args, train_dataset=blocks, data_collator=default_data_collator, callbacks=[timer]
)
trainer.train()
write_result(trainer, timer, model_dir, batch, output)
