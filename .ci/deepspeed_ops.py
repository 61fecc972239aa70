"""DeepSpeed's CPU ops compiled now, as an install with DS_BUILD_OPS would have them, not inside the first
tests that need them: CPU Adam for the offload profiles, the shared-memory collectives every ZeRO run on
CPU uses, async I/O for zero3_nvme where libaio is there (and its runs are tested). Run by each venv's
python: a build is tied to the venv it was compiled against (its include paths), so a second venv
compiles them again.

usage: DS_ACCELERATOR=cpu python .ci/deepspeed_ops.py
"""

import os

from deepspeed.ops.op_builder.cpu import AsyncIOBuilder, CPUAdamBuilder, ShareMemCommBuilder

CPUAdamBuilder().load()
ShareMemCommBuilder().load()
if os.environ.get("FINETUNE_TESTS_WITHOUT_NVME"):
    print(f"ci: async I/O not compiled: {os.environ['FINETUNE_TESTS_WITHOUT_NVME']}")
elif AsyncIOBuilder().is_compatible():
    AsyncIOBuilder().load()
else:
    print("ci: no libaio: zero3_nvme tests will skip")
