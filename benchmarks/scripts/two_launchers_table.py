"""The table of `two_launchers.sh`: the two-launcher run's losses beside the one-launcher run's.

usage: python benchmarks/scripts/two_launchers_table.py DIR PROFILE...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def main(folder: Path, profiles: list[str]) -> None:
    print("| profile | run | status | world size | machines | eval loss | difference to one launcher |")
    print("|---|---|---|---|---|---|---|")
    for profile in profiles:
        one = read(folder / f"{profile}.one-launcher.json")
        two = read(folder / f"{profile}.two-launchers.json")
        for run, summary in (("one launcher", one), ("two launchers", two)):
            loss, reference = summary.get("eval_loss"), one.get("eval_loss")
            difference = f"{abs(loss - reference):.2e}" if loss is not None and reference is not None else ""
            print(f"| {profile} | {run} | {summary.get('status')} | {summary.get('world_size')} | "
                  f"{summary.get('num_hosts')} | {loss} | {difference} |")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
