"""A lever of the sharding floor: each rank's process (and the threads it starts) on its own share of
the machine's cores, so that no rank's host thread shares a core with another rank's busy thread.

usage: accelerate launch ... benchmarks/scripts/pin_and_run.py SCRIPT [ARGS...]
"""

import os
import runpy
import sys

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
cores = sorted(os.sched_getaffinity(0))
share = max(1, len(cores) // ranks_here)
os.sched_setaffinity(0, cores[local_rank * share : (local_rank + 1) * share])
if local_rank == 0:
    print(f"PINNED {ranks_here} ranks to {share} cores each")
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as `python SCRIPT` would
runpy.run_path(sys.argv[0], run_name="__main__")
