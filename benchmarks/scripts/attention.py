"""Causal attention fwd+bwd through each SDPA backend, with and without GPT-2's dropout (issue 6).

usage: python benchmarks/scripts/attention.py OUT_JSON
"""

import json
import sys

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def time_attention(
    backend: SDPBackend, heads: int, dropout: float, batch: int = 8, length: int = 1024
) -> float:
    q, k, v = (
        torch.randn(batch, heads, length, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(batch, heads, length, 64, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        out.backward(grad)

    return triton.testing.do_bench(step, return_mode="median")


rows = []
for heads in (16, 20):
    for dropout in (0.1, 0.0):
        for name, backend in BACKENDS.items():
            try:
                ms = time_attention(backend, heads, dropout)
            except RuntimeError as error:
                ms = None
                print(name, heads, dropout, "unavailable:", str(error).splitlines()[0][:100])
            rows.append({"backend": name, "heads": heads, "dropout": dropout, "fwd_bwd_ms": ms})
            print(rows[-1], flush=True)
with open(sys.argv[1], "w") as file:
    json.dump(rows, file, indent=1)
