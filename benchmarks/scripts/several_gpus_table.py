"""The table of several_gpus.sh call 3: finetune's defaults beside the plain Trainer script under the
same profile, per GPU, from DIR/speed/<profile>.{plain,finetune}.json.

usage: python benchmarks/scripts/several_gpus_table.py DIR

The plain script's rate is the block tokens of one micro batch over its median step (it records the
step times); finetune's is its summary's (tokens of the timed steps over their time), within a few
percent of the same count from its median step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BLOCK, MICRO_BATCH = 1024, 8


def main(folder: Path) -> None:
    speed = folder / "speed"
    profiles = [path.name.split(".")[0] for path in sorted(speed.glob("*.finetune.json"))]
    runs = {p: json.loads((speed / f"{p}.finetune.json").read_text()) for p in profiles}
    ddp = runs["ddp"]["tokens_per_second_per_device"] if "ddp" in runs else None
    columns = [
        "profile", "plain tokens/s per GPU", "plain peak GiB", "finetune tokens/s per GPU",
        "finetune peak GiB", "finetune / plain", "% of finetune's DDP", "finetune MFU", "compiled",
    ]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for profile in sorted(profiles, key=["ddp", "zero3", "fsdp"].index):
        plain = json.loads((speed / f"{profile}.plain.json").read_text())
        plain_rate = BLOCK * MICRO_BATCH / plain["step_time_median_s"]
        run = runs[profile]
        rate = run["tokens_per_second_per_device"]
        print(
            f"| {profile} | {plain_rate:,.0f} | {plain['peak_allocated_gib']:.1f} | {rate:,.0f} | "
            f"{run['memory_peak_allocated_gib_max']:.1f} | {rate / plain_rate:.2f}x | "
            f"{100 * rate / ddp:.0f}% | {100 * run['mfu']:.1f}% | {'yes' if run['torch_compile'] else 'no'} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
