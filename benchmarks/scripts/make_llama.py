"""A Llama-architecture base model for the LoRA comparison of issue 17, saved as a Hub checkpoint is.

Hidden 1024, 24 layers, 16 heads, intermediate 2816, context 1024, the GPT-2 tokenizer's vocabulary
(50,257) with tied embeddings: about a third of a billion parameters. The weights are random (no
Llama weights are on the offline machines) and saved fp32 with `save_pretrained` (safetensors), beside
the GPT-2 tokenizer from $FINETUNE_DATA_DIR/gpt2, because `finetune run --peft lora` loads weights
(it refuses --from_scratch) and plain_lora.py must load the very same base.
usage: python benchmarks/scripts/make_llama.py OUT_DIR
(TINY=1: hidden 64, 2 layers, 4 heads, context 128, for a CPU dry run; SIZE=1b: TinyLlama's shape,
hidden 2048, 22 layers, 32 heads with 4 key/value heads, intermediate 5632, about 1.07B parameters
with the GPT-2 vocabulary, issue 18's "~1B Llama-architecture model")
"""

import os
import sys

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

TINY = os.environ.get("TINY") == "1"
out_dir = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(os.path.join(os.environ["FINETUNE_DATA_DIR"], "gpt2"))
SHAPES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 176},
    "0.36b": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 2816,
    },
    "1b": {
        "hidden_size": 2048,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "intermediate_size": 5632,
    },
}
shape = SHAPES["tiny" if TINY else os.environ.get("SIZE", "0.36b")]
config = LlamaConfig(
    **shape,
    vocab_size=len(tokenizer),
    max_position_embeddings=128 if TINY else 1024,
    tie_word_embeddings=True,
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
