"""The table of `resume_matches.sh`: each resumed run's losses beside the uninterrupted run's.

usage: python benchmarks/scripts/resume_table.py DIR PROFILE...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def losses(summary: dict) -> dict[int, float]:
    return {point["step"]: point["loss"] for point in summary.get("loss_curve", [])}


def largest_relative_difference(run: dict, straight: dict) -> float | None:
    """Over the logged steps both runs trained after the resume point (None if there are none)."""
    start = run.get("resumed_from_step") or 0
    mine, theirs = losses(run), losses(straight)
    steps = [step for step in mine if step > start and step in theirs]
    if not steps:
        return None
    return max(abs(mine[step] - theirs[step]) / abs(theirs[step]) for step in steps)


def rows(folder: Path, profiles: list[str]) -> list[str]:
    lines = [
        "| profile | run | status | resumed from | world size | steps | eval loss | "
        "eval loss vs uninterrupted | largest step-loss difference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for profile in profiles:
        straight = json.loads((folder / f"{profile}.straight.json").read_text())
        for run in ("straight", "stopped", "resumed", "smaller"):
            path = folder / f"{profile}.{run}.json"
            if not path.exists():
                lines.append(f"| {profile} | {run} | missing | | | | | | |")
                continue
            summary = json.loads(path.read_text())
            eval_loss = summary.get("eval_loss")
            eval_diff = (
                f"{abs(eval_loss - straight['eval_loss']) / straight['eval_loss']:.1e}"
                if eval_loss is not None and run != "straight"
                else ""
            )
            step_diff = largest_relative_difference(summary, straight) if run != "straight" else None
            lines.append(
                f"| {profile} | {run} | {summary.get('status')} | {summary.get('resumed_from_step') or ''} | "
                f"{summary.get('world_size')} | {summary.get('steps')} | "
                f"{'' if eval_loss is None else f'{eval_loss:.4f}'} | {eval_diff} | "
                f"{'' if step_diff is None else f'{step_diff:.1e}'} |"
            )
    return lines


if __name__ == "__main__":
    print("\n".join(rows(Path(sys.argv[1]), sys.argv[2:])))
