"""run_summary.json: documented fields, written however the run ends."""

import json
import re
import signal
from pathlib import Path

import pytest

from finetune.run_report import format_report
from finetune.summary import FIELDS, RunRecord, fields_table, read_summary, validate_summary

MEASUREMENTS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "measurements.md"
GPU_SUMMARIES = Path(__file__).resolve().parents[1] / "benchmarks" / "h200-2026-12-04" / "call1" / "runs"


def record(tmp_path, is_main_process=True):
    return RunRecord(str(tmp_path / "out"), "test-run", is_main_process, clock=iter([100.0, 107.5]).__next__)


def test_a_new_record_has_every_documented_field(tmp_path):
    assert validate_summary(record(tmp_path).fields) == []


def test_validation_names_missing_undocumented_and_mistyped_fields(tmp_path):
    fields = record(tmp_path).fields
    del fields["mfu"]
    fields["surprise"] = 1
    fields["steps"] = "ten"
    fields["from_scratch"] = 1
    assert validate_summary(fields) == [
        "missing field mfu",
        "undocumented field surprise",
        "from_scratch is int, documented as bool?",
        "steps is str, documented as int?",
    ]


@pytest.mark.parametrize("path", sorted(GPU_SUMMARIES.glob("*.summary.json")), ids=lambda path: path.name)
def test_summaries_written_on_a_gpu_match_the_schema_in_the_fields_only_cuda_fills(path):
    """The CPU suite never fills memory_device, peak_tflops_source or mfu: these records, one per
    profile on one H200, are what say their types are the documented ones. A field added after them is
    missing from them, so only the other problems count."""
    summary = json.loads(path.read_text())
    assert [problem for problem in validate_summary(summary) if not problem.startswith("missing")] == []
    if summary["status"] == "completed":
        assert summary["memory_device"] == "cuda"
        # MFU's peak is the one of the run's dtype
        assert summary["peak_tflops_source"] == f"H200 SXM {summary['dtype']} datasheet"
        assert 0 < summary["mfu"] < 1


def test_updating_an_undocumented_field_is_refused(tmp_path):
    with pytest.raises(KeyError, match="undocumented"):
        record(tmp_path).update({"surprise": 1})


def test_completed_run_is_written_with_its_wall_time(tmp_path):
    run = record(tmp_path)
    with run.until_exit():
        run.update({"steps": 3})
    written = read_summary(tmp_path / "out")
    assert (written["status"], written["steps"], written["wall_time_s"]) == ("completed", 3, 7.5)
    assert validate_summary(written) == []


def test_failed_run_is_written_with_what_is_known_and_the_error(tmp_path):
    run = record(tmp_path)
    with pytest.raises(RuntimeError), run.until_exit():
        run.update({"model": "gpt2"})
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    written = read_summary(tmp_path / "out")
    assert written["status"] == "failed"
    assert written["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert written["model"] == "gpt2"


def test_interrupted_run_is_written_as_interrupted(tmp_path):
    run = record(tmp_path)
    with pytest.raises(KeyboardInterrupt), run.until_exit():
        raise KeyboardInterrupt("SIGTERM")
    written = read_summary(tmp_path / "out")
    assert (written["status"], written["error"]) == ("interrupted", "interrupted by SIGTERM")


def test_a_run_interrupted_between_saves_names_its_newest_checkpoint(tmp_path):
    for step in (5, 10):
        (tmp_path / "out" / f"checkpoint-{step}").mkdir(parents=True)
    run = record(tmp_path)
    with pytest.raises(KeyboardInterrupt), run.until_exit():
        raise KeyboardInterrupt()
    assert read_summary(tmp_path / "out")["checkpoint"] == str(tmp_path / "out" / "checkpoint-10")


def test_sigterm_handling_is_restored_after_the_run(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    run = record(tmp_path)
    with run.until_exit():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_handler_set_during_the_run_outlives_it(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    run = record(tmp_path)
    try:
        with run.until_exit():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_only_the_main_process_writes(tmp_path):
    run = record(tmp_path, is_main_process=False)
    with run.until_exit():
        pass
    assert not (tmp_path / "out").exists()


def test_report_block_shows_the_headline_numbers(tmp_path):
    fields = record(tmp_path).fields
    fields.update(
        status="completed",
        wall_time_s=95.0,
        strategy="zero3",
        world_size=2,
        device_name="NVIDIA H100 80GB HBM3",
        tokens_per_second=12345.6,
        mfu=0.4123,
        memory_device="cuda",
        memory_peak_allocated_gib_max=12.345,
        eval_loss=3.21,
        eval_perplexity=24.78,
        eval_tokens=1000,
    )
    report = format_report(fields)
    assert "zero3, 2 x NVIDIA H100 80GB HBM3" in report
    assert "12,346 tokens/s" in report
    assert "MFU         41.2 %" in report
    assert "peak 12.35 GiB allocated" in report
    assert "perplexity 24.78 over 1,000 tokens" in report


def test_unknown_numbers_are_shown_as_unknown(tmp_path):
    report = format_report(record(tmp_path).fields)
    assert "MFU         unknown" in report


def test_an_mfu_without_a_known_peak_says_how_to_give_one(tmp_path):
    report = format_report({**record(tmp_path).fields, "device_name": "cpu", "peak_tflops": None})
    assert "MFU         unknown (no peak TFLOP/s known for cpu: --peak_tflops gives one)" in report


def test_the_measurements_page_documents_exactly_the_summary_fields():
    table = fields_table()
    stale = "docs/measurements.md's field table is stale: python -m finetune.summary prints it"
    assert table in MEASUREMENTS_PAGE.read_text(), stale
    assert len(re.findall(r"^\| `", table, flags=re.MULTILINE)) == len(FIELDS)


def test_summary_is_plain_json(tmp_path):
    run = record(tmp_path)
    with run.until_exit():
        pass
    json.loads((tmp_path / "out" / "run_summary.json").read_text())


def test_a_peft_runs_report_says_how_many_parameters_it_trained(tmp_path):
    fields = {
        **record(tmp_path).fields,
        "peft": "lora",
        "parameters": 124_000_000,
        "trainable_parameters": 811_008,
    }
    assert "124,000,000 parameters (811,008 trainable: lora adapters)" in format_report(fields)
