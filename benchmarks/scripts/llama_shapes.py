"""The Llama-architecture shapes the benchmarks build, named once: make_llama.py saves them as models;
the CPU censuses (saved_tensor_census.py, float8_census.py) count their blocks.

Each has the GPT-2 tokenizer's vocabulary (no Llama tokenizer is on the offline machines), context
1024 and tied embeddings. 0.36b: hidden 1024, 24 layers, 16 heads, intermediate 2816, about a third of
a billion parameters; 1b: TinyLlama's shape, hidden 2048, 22 layers, 32 heads with 4 key/value heads,
intermediate 5632, about 1.07B; tiny: hidden 64, 2 layers, 4 heads, context 128, for CPU dry runs.
"""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig

GPT2_VOCABULARY = 50257
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
CENSUS_MODELS = {f"llama-{size}": size for size in ("0.36b", "1b")}  # the censuses' names for them


def llama_config(size: str, **overrides: Any) -> LlamaConfig:
    """The shape's config; `overrides` (fewer layers for a census, the tokenizer's ids) win."""
    settings = {
        **SHAPES[size],
        "vocab_size": GPT2_VOCABULARY,
        "max_position_embeddings": 128 if size == "tiny" else 1024,
        "tie_word_embeddings": True,
    }
    return LlamaConfig(**{**settings, **overrides})
