"""One line for a floor.sh case folder: tokens/s per GPU, median step, peak memory, loss; the trace's
numbers and the sync audit where the case was traced, py-spy's host time where it was sampled.
usage: python floor_line.py CASE_DIR"""

import json
import sys
from pathlib import Path


def line(folder: Path) -> str:
    parts = []
    summary, plain = folder / "run_summary.json", folder / "plain.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        step_ms = (s.get("step_time_median_s") or 0) * 1e3
        parts.append(
            f"{s.get('status')} {s.get('tokens_per_second_per_device') or 0:,.0f} tok/s/GPU, step "
            f"{step_ms:.0f} ms, peak {s.get('memory_peak_allocated_gib_max')} GiB, "
            f"MFU {s.get('mfu')}, loss {s.get('final_loss')}"
        )
    for peer in (plain, folder / "bare.json"):  # runs without finetune
        if peer.exists():
            p = json.loads(peer.read_text())
            parts.append(" ".join(f"{k} {v}" for k, v in p.items() if not isinstance(v, (list, dict)))[:200])
    traces = folder / "traces.json"
    if traces.exists():
        t = json.loads(traces.read_text())
        rank0, collectives = t["ranks"].get("0", {}), t.get("collectives", {})
        parts.append(
            f"rank0 step {rank0.get('step_ms')} ms compute {rank0.get('gpu_compute_ms')} nccl "
            f"{rank0.get('gpu_nccl_ms')} idle {rank0.get('gpu_idle_ms')}; "
            f"last {collectives.get('last_to_arrive')} {collectives.get('why_last_was_late')}"
        )
    samples = folder / "host_samples.json"
    if samples.exists():
        ranks = json.loads(samples.read_text())["ranks"].values()
        parts.append("py-spy host ms a step " + ", ".join(str(rank["host_ms_per_step"]) for rank in ranks))
        backward = [
            str(rank["backward_thread"]["host_ms_per_step"]) for rank in ranks if "backward_thread" in rank
        ]
        if backward:
            parts.append("backward thread " + ", ".join(backward))
    syncs = sorted(folder.glob("rank*.syncs.json"))
    if syncs:
        parts.append(f"syncs rank0 {json.loads(syncs[0].read_text())['syncs']}")
    return " | ".join(parts) or "no result"


if __name__ == "__main__":
    print(line(Path(sys.argv[1])))
