"""Tables of several_gpus.sh call 4 (`finetune doctor` on GPUs).

usage: python benchmarks/scripts/doctor_table.py DIR/doctor        doctor's bus bandwidth beside the
                                                                    plain torch loop's, per GPU count
       python benchmarks/scripts/doctor_table.py DIR/doctor/X.json  rank 0's rows of one doctor.json as
                                                                    doctor prints them (every rank runs
                                                                    the same per-rank checks)

Doctor's figure is rank 0's row (time.monotonic around a few calls, as a user's first look); the torch
loop's is benchmarks/scripts/collective_loop.py (CUDA events around 50 calls), both bus bandwidth.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from finetune.doctor import Check, table

ROW = re.compile(r"(all-reduce|all-gather) (\d+) MiB")


def bandwidth_table(folder: Path) -> str:
    lines = [
        "| GPUs | collective | size | doctor GB/s | torch loop GB/s | doctor / torch loop |",
        "|---|---|---|---|---|---|",
    ]
    for loop_file in sorted(folder.glob("torch-*.json")):
        gpus = int(loop_file.stem.split("-")[1])
        loop = {
            (row["operation"], row["bytes"] >> 20): row["busbw_gbps"]
            for row in json.loads(loop_file.read_text())
        }
        for row in json.loads((folder / f"ddp-{gpus}.json").read_text()):
            found = ROW.fullmatch(row["name"])
            if row["rank"] != 0 or not found:
                continue
            measured = float(row["measured"].split()[0])
            reference = loop[(found.group(1), int(found.group(2)))]
            lines.append(
                f"| {gpus} | {found.group(1)} | {found.group(2)} MiB | {measured:.1f} | {reference:.1f} | "
                f"{measured / reference:.2f} |"
            )
    return "\n".join(lines)


def main(path: Path) -> None:
    if path.is_dir():
        print(bandwidth_table(path))
    else:
        print(table([Check(**row) for row in json.loads(path.read_text()) if row["rank"] == 0]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
