"""A launched rank ends with its entry point's exit code and its atexit handlers run, without the
interpreter teardown that could hang or abort it on the gloo process group (finetune/run.py)."""

import subprocess
import sys

import pytest

RANK = """
import atexit, sys, torch.distributed as dist
from finetune.run import exit_without_teardown
atexit.register(lambda: print("atexit ran", flush=True))
if sys.argv[1] == "group":
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    dist.barrier()
def entry():
    if sys.argv[3] != "0":
        raise SystemExit(int(sys.argv[3]))
exit_without_teardown(entry)
"""


@pytest.mark.parametrize("group", ["group", "none"])
@pytest.mark.parametrize("code", [0, 2, 75])
def test_a_rank_exits_with_its_code_after_its_atexit_handlers(tmp_path, group, code):
    ended = subprocess.run(
        [sys.executable, "-c", RANK, group, str(tmp_path / "store"), str(code)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ended.returncode == code, ended.stderr[-2000:]
    assert ended.stdout.splitlines()[-1] == "atexit ran"
