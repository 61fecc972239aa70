"""The tiny GPT-2 and Llama shapes the unit tests build models from, dropout off, by architecture."""

from transformers import GPT2Config, LlamaConfig, PretrainedConfig

TINY_SHAPES = {
    "gpt2": (
        GPT2Config,
        {"n_layer": 2, "n_embd": 32, "n_head": 2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    ),
    "llama": (
        LlamaConfig,
        {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2},
    ),
}


def tiny_config(architecture: str, **overrides) -> PretrainedConfig:
    config_class, shape = TINY_SHAPES[architecture]
    return config_class(**{**shape, **overrides})
