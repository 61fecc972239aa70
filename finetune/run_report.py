"""The end-of-run block a run prints from its summary's fields: the numbers a user pastes into a report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finetune.run_folder import SUMMARY_FILE


def format_report(fields: dict[str, Any]) -> str:
    """The end-of-run block: the numbers a user pastes into a report."""

    def number(value: Any, spec: str, unit: str = "") -> str:
        return "unknown" if value is None else f"{value:{spec}}{unit}"

    mfu_percent = None if fields["mfu"] is None else 100 * fields["mfu"]

    float8 = f" (float8 matmuls in {fields['fp8_layers']} layers)" if fields.get("fp8_layers") else ""
    lines = [
        f"finetune: {fields['status']} in {number(fields['wall_time_s'], '.0f', ' s')} of wall time"
        + (
            f", {fields['time_to_first_step_s']:.0f} s of it start-up"
            if fields.get("time_to_first_step_s") is not None
            else ""
        )
        + f" ({fields['strategy'] or fields['profile']}, {fields['world_size']} x {fields['device_name']})",
        f"  model       {fields['model']}: {number(fields['parameters'], ',')} parameters"
        + (
            f" ({fields['trainable_parameters']:,} trainable: {fields['peft']} adapters), "
            if fields.get("peft") and fields.get("trainable_parameters") is not None
            else ", "
        )
        + f"{fields['dtype']}{float8}, block {fields['block_size']}, "
        f"global batch {fields['global_batch_size']}",
        f"  training    {fields['steps']} steps, loss {number(fields['final_loss'], '.4f')} at the last log",
        f"  throughput  {number(fields['tokens_per_second'], ',.0f')} tokens/s "
        f"({number(fields['tokens_per_second_per_device'], ',.0f')} per device), "
        f"{number(fields['samples_per_second'], '.2f')} samples/s, step "
        f"{number(fields['step_time_median_s'], '.3f', ' s')} median, "
        f"{number(fields['step_time_p90_s'], '.3f', ' s')} p90 "
        f"(over {fields['throughput_steps']} steps after {fields['throughput_warmup_steps']} warm-up)",
        f"  MFU         {number(mfu_percent, '.1f', ' %')} "
        + (
            f"({number(fields['achieved_tflops_per_device'], '.1f')} of "
            f"{number(fields['peak_tflops'], '.1f')} TFLOP/s per device)"
            if fields["peak_tflops"] is not None
            else f"(no peak TFLOP/s known for {fields['device_name']}: --peak_tflops gives one)"
        ),
    ]
    if fields.get("batch_choice"):  # .get: summaries stored before the field existed are reported too
        lines.insert(
            2,
            f"  batch       micro batch {fields['micro_batch_size']} x accumulation "
            f"{fields['gradient_accumulation_steps']} x {fields['world_size']} process(es): "
            f"{fields['batch_choice']}",
        )
    if fields.get("time_to_first_step_s") is not None:
        phases = ", ".join(
            f"{phase} {seconds:.1f}" for phase, seconds in (fields.get("startup_phases_s") or {}).items()
        )
        lines.append(
            f"  start-up    {fields['time_to_first_step_s']:.1f} s to the first optimizer step"
            + (f" ({phases})" if phases else "")
        )
    if fields["memory_device"] == "cuda":
        lines.append(
            f"  GPU memory  peak {number(fields['memory_peak_allocated_gib_max'], '.2f', ' GiB')} allocated "
            f"(rank {fields['memory_peak_allocated_rank']}; mean "
            f"{number(fields['memory_peak_allocated_gib_mean'], '.2f')}), "
            f"{number(fields['memory_peak_reserved_gib_max'], '.2f', ' GiB')} reserved; "
            f"set-up peak {number(fields['memory_setup_peak_allocated_gib_max'], '.2f', ' GiB')}"
        )
    lines.append(
        f"  host memory peak RSS {number(fields['memory_host_peak_rss_gib_max'], '.2f', ' GiB')} "
        f"(rank {fields['memory_host_peak_rss_rank']}; mean "
        f"{number(fields['memory_host_peak_rss_gib_mean'], '.2f')})"
    )
    for split in ("eval", "test"):
        if fields[f"{split}_loss"] is not None:
            lines.append(
                f"  {split:<11} loss {fields[f'{split}_loss']:.4f}, perplexity "
                f"{fields[f'{split}_perplexity']:.2f} over {fields[f'{split}_tokens']:,} tokens"
            )
    lines.append(f"  summary     {Path(fields['output_dir']) / SUMMARY_FILE}")
    return "\n".join(lines)
