"""A Llama-architecture base model (benchmarks/scripts/llama_shapes.py's shapes), saved as a Hub
checkpoint is: random weights (no Llama weights are on the offline machines) saved fp32 with
`save_pretrained` (safetensors), beside the GPT-2 tokenizer from $FINETUNE_DATA_DIR/gpt2, because
`finetune run --peft lora` loads weights (it refuses --from_scratch) and plain_lora.py must load the
very same base.
usage: python benchmarks/scripts/make_llama.py OUT_DIR (SIZE=0.36b, the default, or 1b; TINY=1: the
tiny shape, for a CPU dry run)
"""

import os
import sys

import torch
from llama_shapes import llama_config
from transformers import AutoTokenizer, LlamaForCausalLM

TINY = os.environ.get("TINY") == "1"
out_dir = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(os.path.join(os.environ["FINETUNE_DATA_DIR"], "gpt2"))
config = llama_config(
    "tiny" if TINY else os.environ.get("SIZE", "0.36b"),
    vocab_size=len(tokenizer),
    bos_token_id=tokenizer.bos_token_id,
    eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.eos_token_id,
)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
parameters = sum(p.numel() for p in model.parameters())  # tied: the embedding counted once
print(f"make_llama: {parameters:,} parameters ({parameters / 1e9:.3f}B) -> {out_dir}")
model.save_pretrained(out_dir)
tokenizer.save_pretrained(out_dir)
