"""Model FLOPs per token and peak device FLOP/s: the two halves of MFU.

MFU = (model FLOPs per token * tokens per second per device) / peak dense FLOP/s of the device in
the training dtype. Model FLOPs follow the PaLM paper (appendix B) and nanoGPT's `estimate_mfu`:

    6·N + 12·L·H·T per token

with N the parameters that take part in a matrix multiply (every parameter except embedding
lookups, plus the output projection when it is tied to the input embedding), L layers, H the hidden
size and T the sequence length. Activation recomputation (gradient checkpointing) is hardware work,
not model work, and is not counted.

A frozen weight (the base model under LoRA/DoRA, finetune/adapters.py) costs 4 FLOPs per token, not
6: 2 forward and 2 for the gradient of its input, which the layers below it need, but none for
its own gradient. So with F of the N frozen: 6·(N - F) + 4·F + 12·L·H·T. The attention term has no
weights and is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig


def matmul_parameters(model: nn.Module, frozen_only: bool = False) -> int:
    """N of 6·N: parameters that enter a matrix multiply once per token (`frozen_only`: those of them
    that are not trained).

    Embedding tables (token, position) are lookups, not multiplies. A tied LM head multiplies by
    the token embedding table, so that table counts once. Under ZeRO-3 `ds_numel` holds a
    partitioned parameter's full size.
    """
    embedding_tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    unique = {id(p): p for p in model.parameters() if not (frozen_only and p.requires_grad)}
    count = sum(_numel(p) for key, p in unique.items() if key not in embedding_tables)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is not None and id(output.weight) in embedding_tables and id(output.weight) in unique:
        count += _numel(output.weight)
    return count


def _numel(parameter: torch.Tensor) -> int:
    return getattr(parameter, "ds_numel", parameter.numel())


def flops_per_token(
    matmul_params: int, num_layers: int, hidden_size: int, sequence_length: int, frozen_matmul_params: int = 0
) -> int:
    """Training (forward + backward) model FLOPs per token: 6 per trained and 4 per frozen matmul weight
    (`frozen_matmul_params` of the `matmul_params`), 12·L·H·T for attention."""
    trained = matmul_params - frozen_matmul_params
    return 6 * trained + 4 * frozen_matmul_params + 12 * num_layers * hidden_size * sequence_length


def model_flops_per_token(model: nn.Module, config: PretrainedConfig, sequence_length: int) -> int:
    return flops_per_token(
        matmul_parameters(model),
        config.num_hidden_layers,
        config.hidden_size,
        sequence_length,
        matmul_parameters(model, frozen_only=True),
    )


@dataclass(frozen=True)
class PeakFlops:
    """A device's peak dense FLOP/s for one dtype, and where the number comes from."""

    tflops: float
    source: str


# Dense (no 2:4 sparsity) tensor-core TFLOP/s from NVIDIA's datasheets; "fp32" is non-tensor-core
# FP32 (PyTorch's default for float32 matmuls), "tf32" applies when TF32 matmuls are enabled.
# Rows are tried in order with every word of the pattern required in the lower-cased device name,
# as torch.cuda.get_device_name() spells it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB").
PEAK_TFLOPS: tuple[tuple[str, tuple[str, ...], dict[str, float]], ...] = (
    # https://resources.nvidia.com/en-us-data-center-overview/h200-datasheet (H200 SXM / NVL)
    ("H200 NVL", ("h200", "nvl"), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H200 SXM", ("h200",), {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}),
    # https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (H100 SXM / NVL / PCIe)
    ("H100 NVL", ("h100", "nvl"), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H100 PCIe", ("h100", "pcie"), {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0}),
    ("H100 SXM", ("h100", "hbm3"), {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    ("A100", ("a100",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    # https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet
    ("L4", ("l4",), {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    # NVIDIA publishes no A10G sheet: the A10 datasheet's figures, as PyTorch Lightning's table uses.
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf
    ("A10G", ("a10g",), {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    # https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
    ("V100S PCIe", ("v100s",), {"fp16": 130.0, "fp32": 16.4}),
    ("V100 SXM2", ("v100", "sxm2"), {"fp16": 125.0, "fp32": 15.7}),
    ("V100 PCIe", ("v100", "pcie"), {"fp16": 112.0, "fp32": 14.0}),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf
    ("T4", ("t4",), {"fp16": 65.0, "fp32": 8.1}),
)


def _words(device_name: str) -> set[str]:
    return set(device_name.lower().replace("-", " ").replace("_", " ").split())


def peak_flops(device_name: str, dtype: str, override_tflops: float | None = None) -> PeakFlops | None:
    """Peak dense FLOP/s for `dtype` (bf16, fp16, tf32, fp32) on the named device; None when unknown.

    An unknown device, or a dtype the device has no tensor-core rate for, gives None: MFU is then
    reported as unknown rather than guessed.
    """
    if override_tflops is not None:
        return PeakFlops(override_tflops, "--peak_tflops")
    words = _words(device_name)
    for label, pattern, rates in PEAK_TFLOPS:
        if set(pattern) <= words:
            return PeakFlops(rates[dtype], f"{label} {dtype} datasheet") if dtype in rates else None
    return None


def training_dtype(bf16: bool, fp16: bool, tf32_matmul: bool) -> str:
    if bf16:
        return "bf16"
    if fp16:
        return "fp16"
    return "tf32" if tf32_matmul else "fp32"


def tf32_matmuls() -> bool:
    """Whether float32 matmuls run as TF32, read through the API that set it.

    Since PyTorch 2.9 reading the legacy `allow_tf32` flag raises once the new `fp32_precision`
    API was used (transformers uses it, e.g. when torch.compile is on); the new API reflects both.
    """
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if precision is None:
        return torch.backends.cuda.matmul.allow_tf32
    return precision == "tf32"


def mfu(token_flops: int, tokens_per_second_per_device: float, peak: PeakFlops | None) -> float | None:
    """Achieved model FLOP/s per device over its peak, as a fraction; None when the peak is unknown."""
    if peak is None or peak.tflops <= 0:
        return None
    return token_flops * tokens_per_second_per_device / (peak.tflops * 1e12)
