"""How the chunked loss cuts the logits: read by finetune/losses.py, which computes so, and by
finetune/memory_model.py, which counts what it holds (kept here, below both layers, so the planner
counts the same chunks the loss makes)."""

CHUNK_LOGITS = 2**26  # logits per chunk: 256 MiB in fp32
VOCAB_ALIGNMENT = 64  # a vocabulary padded to this keeps every matmul on aligned, fast kernels
