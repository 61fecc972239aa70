"""A model of a GPT-2 shape with random weights, saved as a Hub checkpoint is, for runs that need
weights to load: `finetune run --peft lora` refuses --from_scratch (adapters on random weights that
are never saved would be lost), so LoRA beside full fine-tuning of the same shape trains on this.
usage: python benchmarks/scripts/save_initialised.py MODEL OUT_DIR (MODEL: a folder name in
$FINETUNE_DATA_DIR, e.g. gpt2-medium; fp32 weights, seed 0)
"""

import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

name, out_dir = sys.argv[1], sys.argv[2]
source = os.path.join(os.environ["FINETUNE_DATA_DIR"], name)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
model.save_pretrained(out_dir)
AutoTokenizer.from_pretrained(source).save_pretrained(out_dir)
print(f"save_initialised: {name} ({sum(p.numel() for p in model.parameters()):,} parameters) -> {out_dir}")
