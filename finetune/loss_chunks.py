"""How the chunked loss cuts the logits: read by finetune/losses.py, which computes so, and by
finetune/memory_model.py, which counts what it holds on a GPU (kept here, below both layers, so the
planner counts the same chunks the loss makes)."""

CHUNK_LOGITS = 2**26  # logits per chunk on a GPU: 256 MiB in fp32
# On a CPU there is no caching allocator: a chunk's logits-sized buffers come from glibc's malloc,
# which maps a buffer above its mmap threshold (32 MiB at most) afresh and unmaps it when freed, so
# every chunk of every step faulted its pages in again; buffers of 8 MiB stay in the heap, reused.
CPU_CHUNK_LOGITS = 2**21
VOCAB_ALIGNMENT = 64  # a vocabulary padded to this keeps every matmul on aligned, fast kernels


def tokens_per_chunk(device_type: str, vocab: int, width: int) -> int:
    """Tokens whose logits one chunk computes, on a device of this type ("cpu", "cuda", ...).

    On a CPU a chunk is also at least half the width in tokens: each chunk reads the whole output
    weight three times (logits, and both gradients), which for wide models and short chunks costs
    more than the faults the small buffers save."""
    if device_type != "cpu":
        return max(1, CHUNK_LOGITS // vocab)
    return max(1, CPU_CHUNK_LOGITS // vocab, width // 2)
