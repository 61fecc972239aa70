"""finetune plan --fp8: what float8 matmuls change in a step's memory (counted by the CPU float8 census,
not fitted), checked against float8 peaks measured on GPUs, and the profiles --fp8 runs under."""

import pytest
from transformers import AutoConfig

from finetune.arguments import parse_arguments
from finetune.calibration import estimate_for, fit_calibration, measured_calibration, read_measurements
from finetune.cli import main as cli_main
from finetune.layout import ParallelLayout
from finetune.memory_model import estimate
from finetune.model_shapes import gpt2_shape
from finetune.planner import Hardware, largest_micro_batch, run_workload
from finetune.profiles import load_strategy
from finetune.workload import ModelShape, Workload

SINGLE = load_strategy("single")


@pytest.fixture(scope="module")
def calibration():
    return measured_calibration()


@pytest.fixture(scope="module")
def float8_rows():
    rows = [m for m in read_measurements() if m.workload.fp8]
    assert rows
    return rows


def test_a_shape_counts_the_weights_fp8_multiplies_in_float8(data_dir):
    """Every block's four projections (GPT-2: 12 x width² a layer), not the output layer."""
    shape = ModelShape.from_config("gpt2-xl", AutoConfig.from_pretrained(data_dir / "gpt2-xl"))
    assert shape.float8_weights == 48 * 12 * 1600 * 1600


def test_float8_peaks_check_the_planner_and_are_not_fitted_to(float8_rows):
    without = [m for m in read_measurements() if not m.workload.fp8]
    assert fit_calibration(read_measurements()) == fit_calibration(without)


def test_every_measured_float8_peak_is_predicted_within_15_percent(float8_rows, calibration):
    for measurement in float8_rows:
        predicted = estimate_for(measurement, calibration).total
        assert predicted == pytest.approx(measurement.peak_allocated_gib, rel=0.15), measurement


def test_float8_saves_what_was_measured_on_gpt2_xl(calibration):
    """gpt2-xl under single at 8 x 1024, compiled, on one H200: 43.88 GiB, 35.50 with --fp8 (8.38 less;
    benchmarks/h200-2026-12-05)."""
    shape, layout = gpt2_shape("gpt2-xl"), ParallelLayout(1)
    bf16 = estimate(SINGLE, shape, Workload(8, 1024), layout, calibration).total
    float8 = estimate(SINGLE, shape, Workload(8, 1024, fp8=True), layout, calibration).total
    assert bf16 - float8 == pytest.approx(43.88 - 35.50, rel=0.05)


def test_plan_with_fp8_plans_only_the_profiles_it_runs_under(capsys):
    assert cli_main(["plan", "--model", "gpt2-medium", "--fp8", "--gpus", "2", "--gpu_memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "float8 matmuls (--fp8)" in out.splitlines()[0]
    assert "the rest eager" not in out.splitlines()[0]  # every profile --fp8 runs under compiles
    table = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| profile")]
    assert [line.split("|")[1].strip() for line in table] == ["ddp", "fsdp_grad_op", "fsdp"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--profiles", "fsdp,zero3"], "--fp8 runs under single, ddp and the FSDP profiles, not zero3"),
        (["--peft", "lora"], "--fp8 is for full fine-tuning"),
    ],
)
def test_plan_refuses_fp8_where_the_run_refuses_it_in_one_line(flags, expected, capsys):
    with pytest.raises(SystemExit) as exit:
        cli_main(["plan", "--model", "gpt2-medium", "--fp8", *flags, "--gpus", "2", "--gpu_memory", "80"])
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and expected in error


def test_a_global_batch_is_planned_with_the_runs_fp8(calibration):
    """--global_batch_size picks the micro batch from run_workload, which reads --fp8."""
    flags = ["--model", "gpt2-xl", "--output_dir", "unused"]
    shape, bf16 = run_workload(*parse_arguments(flags))
    _, float8 = run_workload(*parse_arguments([*flags, "--fp8"]))
    assert float8.fp8 and not bf16.fp8
    hardware = Hardware(ParallelLayout(1), 80)
    assert largest_micro_batch(SINGLE, shape, float8, hardware, calibration) > largest_micro_batch(
        SINGLE, shape, bf16, hardware, calibration
    )


def test_fsdp_keeps_float8_casts_of_the_gathered_gpt2_weights_whole_on_every_rank(calibration):
    """FSDP2 gathers each block's bf16 weights; GPT-2's float8 blocks keep a one-byte cast of them for
    the backward, which sharding over more ranks does not divide."""
    fsdp, shape = load_strategy("fsdp"), gpt2_shape("gpt2-xl")
    for gpus in (2, 4):
        layout = ParallelLayout(gpus)
        bf16 = estimate(fsdp, shape, Workload(8, 1024), layout, calibration).activations
        float8 = estimate(fsdp, shape, Workload(8, 1024, fp8=True), layout, calibration).activations
        inputs = 12 * shape.layers * 8 * 1024 * shape.hidden / 2**30
        assert float8 - bf16 == pytest.approx(shape.float8_weights / 2**30 - inputs)
