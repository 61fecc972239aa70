"""benchmarks/scripts/: the parts of the GPU benchmark scripts that run without a GPU.

The GPU runs themselves are not tests (benchmarks/README.md); what is checked here is that
tables.py instruction_lora reads a folder of results the way instruction_lora.sh names them, and that
memory_snapshot.py finds what was alive at the peak of an allocator trace, without training anything.
"""

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


tables = load_script("tables")
memory_snapshot = load_script("memory_snapshot")
allocation_census = load_script("allocation_census")

FALLING = [{"step": 10, "loss": 9.0}, {"step": 20, "loss": 7.0}]


def store(folder: Path, name: str, **fields) -> None:
    (folder / f"{name}.json").write_text(json.dumps({"loss_curve": FALLING, **fields}))


def printed_tables(folder: Path) -> dict[str, str]:
    """The printed tables by the first word of their heading (GSM8K, LoRA)."""
    printed = tables.instruction_lora(folder).split("\n\n")
    return {table.split()[1].rstrip(","): table for table in printed}


def speed_rows(folder: Path) -> dict[str, list[str]]:
    """The cells of each row of a speed table by its first cell ('| plain', '| finetune')."""
    return {row.split(" | ")[0]: row.split(" | ") for row in tables.speed(folder).splitlines()[2:]}


def table_row(folder: Path, task: str, what: str) -> list[str]:
    """The cells of one row of the GSM8K or LoRA table."""
    lines = printed_tables(folder)[task].splitlines()
    return next(line for line in lines if line.startswith(f"| {what} |")).strip("|").split(" | ")


def test_the_real_tokens_ratio_is_finetune_over_the_plain_script_median_of_repeats(tmp_path):
    for run, rate in enumerate((900, 1000, 5000), start=1):
        store(tmp_path, f"plain_instruction.gpt2-medium.b16.run{run}", tokens_per_second=rate)
    store(tmp_path, "finetune_instruction.gpt2-medium.b4.run1", tokens_per_second=8000)
    assert table_row(tmp_path, "GSM8K", "real tokens/s")[1:4] == ["1,000", "8,000", "8.00x"]


def test_finetunes_peak_memory_is_the_higher_of_its_set_up_and_training_peaks(tmp_path):
    store(tmp_path, "plain_lora.llama.b8.run1", peak_allocated_gib=16.0)
    store(
        tmp_path,
        "finetune_lora.llama.b8.run1",
        memory_setup_peak_allocated_gib_max=12.0,
        memory_peak_allocated_gib_max=8.0,
    )
    assert table_row(tmp_path, "LoRA", "peak allocated GiB")[1:4] == ["16.00", "12.00", "0.75x"]


def test_a_setup_whose_loss_did_not_fall_is_marked(tmp_path):
    store(tmp_path, "plain_lora.llama.b8.run1", tokens_per_second=1.0)
    flat = [{"step": 10, "loss": 9.0}, {"step": 20, "loss": 9.5}]
    store(tmp_path, "finetune_lora.llama.b8.run1", tokens_per_second=1.0, loss_curve=flat)
    assert table_row(tmp_path, "LoRA", "loss fell")[1:3] == ["yes (9.00 -> 7.00)", "NO (9.00 -> 9.50)"]


def test_a_folder_of_one_task_prints_that_tasks_table_only(tmp_path):
    store(tmp_path, "plain_lora.llama.b8.run1", tokens_per_second=1.0)
    store(tmp_path, "finetune_lora_eager.llama.b8.run1", tokens_per_second=2.0)
    assert list(printed_tables(tmp_path)) == ["LoRA"]


def allocation(addr, size, site):
    torch_frame = {"filename": "/venv/site-packages/torch/nn/functional.py", "line": 1, "name": "linear"}
    return {"action": "alloc", "addr": addr, "size": size, "frames": [torch_frame, site]}


def freed(addr, size):
    return {"action": "free_completed", "addr": addr, "size": size}


LAYER = {"filename": "/venv/site-packages/peft/tuners/lora/layer.py", "line": 7, "name": "forward"}
LOSS = {"filename": "/project/finetune/losses.py", "line": 3, "name": "forward"}


def test_the_peak_is_the_most_allocated_moment_and_its_live_set_is_summed_by_the_asking_frame():
    trace = [
        allocation(1, 100, LAYER),
        allocation(2, 50, LAYER),
        allocation(3, 300, LOSS),  # the peak: 1000 + 450
        freed(3, 300),
        freed(1, 100),
        allocation(4, 200, LOSS),  # 1000 + 250: lower, and not what was alive at the peak
    ]
    peak, index = memory_snapshot.peak_event(trace, before_bytes=1000)
    assert (peak, index) == (1450, 2)
    sites = memory_snapshot.live_at_peak(memory_snapshot.alive_at(trace, index), before_bytes=1000)
    assert sites == {
        memory_snapshot.BEFORE: [1000, 0],
        "peft/tuners/lora/layer.py:7 forward": [150, 2],
        "/project/finetune/losses.py:3 forward": [300, 1],
    }


def test_a_free_requested_but_not_completed_still_counts_as_alive():
    trace = [allocation(1, 100, LAYER), {"action": "free_requested", "addr": 1, "size": 100}]
    trace += [allocation(2, 10, LOSS)]
    assert memory_snapshot.peak_event(trace, before_bytes=0) == (110, 2)


def test_the_largest_stacks_at_the_peak_group_allocations_of_one_stack_and_size():
    trace = [allocation(1, 100, LAYER), allocation(2, 100, LAYER), allocation(3, 300, LOSS), freed(1, 100)]
    alive = memory_snapshot.alive_at(trace, 2)
    stacks = memory_snapshot.largest_stacks(alive)
    assert [(group["bytes_each"], group["allocations"]) for group in stacks] == [(300, 1), (100, 2)]
    assert stacks[1]["stack"] == ("torch/nn/functional.py:1 linear <- peft/tuners/lora/layer.py:7 forward")


def test_the_allocation_census_reads_each_mark_and_restarts_the_peak_after_each_steps_end():
    mib = 2**20
    timeline = [(3, "FORWARD_END"), (1, 4 * mib), (2, 6 * mib), (4, -6 * mib), (5, "STEP_END"),
                (6, 1 * mib), (7, "STEP_END"), (3, -2 * mib)]  # fmt: skip
    assert allocation_census.tally(timeline) == [
        ("FORWARD_END", 8.0, 10.0),  # a free at the mark's time counts before it
        ("STEP_END", 2.0, 10.0),
        ("STEP_END", 3.0, 3.0),
    ]


def test_a_speed_rows_model_may_hold_dots_and_an_accumulating_step_counts_all_its_micro_batches(tmp_path):
    """A run of micro batch 16 x accumulation 2 on one GPU trains 32 x 1024 tokens a step."""
    finetune = {"model": "/tmp/w/llama-0.36b", "flops_per_token": 6, "peak_tflops": 1.0}
    store(tmp_path, "finetune.llama-0.36b.b16.run1", step_time_median_s=0.5, global_batch_size=32,
          world_size=1, memory_peak_allocated_gib_max=40.0, **finetune)  # fmt: skip
    store(tmp_path, "plain.llama-0.36b.b16.run1", step_time_median_s=0.5, peak_allocated_gib=50.0)
    rows = speed_rows(tmp_path)
    assert rows["| finetune"][1:5] == ["llama-0.36b", "16", "1", "65,536"]  # 32 x 1024 / 0.5 s
    assert rows["| plain"][4] == "32,768"  # no accumulation: 16 x 1024 / 0.5 s
    assert rows["| finetune"][6] == "2.00"


def test_a_plain_run_that_accumulates_counts_all_its_micro_batches(tmp_path):
    """The plain script at micro batch 8 x 8 (a global batch of 64) trains 64 x 1024 tokens a step."""
    finetune = {"model": "gpt2-medium", "flops_per_token": 6, "peak_tflops": 1.0}
    store(tmp_path, "finetune.gpt2-medium.b32.run1", step_time_median_s=1.0, global_batch_size=64,
          world_size=1, memory_peak_allocated_gib_max=50.0, **finetune)  # fmt: skip
    store(tmp_path, "plain.gpt2-medium.b8.run1", step_time_median_s=2.0, gradient_accumulation_steps=8,
          peak_allocated_gib=26.0)  # fmt: skip
    rows = speed_rows(tmp_path)
    assert rows["| plain"][4] == "32,768"  # 8 x 8 x 1024 / 2 s
    assert rows["| finetune"][6] == "2.00"  # 64 x 1024 / 1 s against it


def test_a_resumed_runs_step_losses_are_compared_after_its_resume_point_only(tmp_path):
    straight = [{"step": 10, "loss": 4.0}, {"step": 20, "loss": 2.0}]
    resumed = [{"step": 10, "loss": 9.0}, {"step": 20, "loss": 2.2}]  # step 10 was before the resume
    store(tmp_path, "ddp.straight", loss_curve=straight, eval_loss=2.0, status="completed")
    store(tmp_path, "ddp.resumed", loss_curve=resumed, eval_loss=2.1, resumed_from_step=10, status="done")
    printed = tables.resume(tmp_path, ["ddp"]).splitlines()[2:]
    rows = {row.split(" | ")[1]: row.strip("| ").split(" | ") for row in printed}
    assert rows["resumed"][-2:] == ["5.0e-02", "1.0e-01"]  # eval 2.1 vs 2.0; step 20: 2.2 vs 2.0
    assert rows["stopped"][2] == "missing"


def test_a_resume_between_two_logs_leaves_the_shortened_window_after_it_uncompared(tmp_path):
    """Resumed from step 12, the run's step-15 log averages steps 13-15 against the straight run's
    11-15: a difference of window, not of training; step 20's window (16-20) is compared."""
    straight = [{"step": 10, "loss": 4.0}, {"step": 15, "loss": 3.0}, {"step": 20, "loss": 2.0}]
    resumed = [{"step": 10, "loss": 4.0}, {"step": 15, "loss": 2.5}, {"step": 20, "loss": 2.2}]
    store(tmp_path, "ddp.straight", loss_curve=straight, eval_loss=2.0, status="completed")
    store(tmp_path, "ddp.resumed", loss_curve=resumed, eval_loss=2.0, resumed_from_step=12, status="done")
    printed = tables.resume(tmp_path, ["ddp"]).splitlines()[2:]
    rows = {row.split(" | ")[1]: row.strip("| ").split(" | ") for row in printed}
    assert rows["resumed"][-1] == "1.0e-01"  # step 20 only: 2.2 vs 2.0


def test_the_resume_steps_table_lists_each_loss_after_the_resume_and_marks_a_shortened_window(tmp_path):
    straight = [{"step": 10, "loss": 4.0}, {"step": 15, "loss": 3.0}, {"step": 20, "loss": 2.0}]
    store(tmp_path, "zero3.straight", loss_curve=straight)
    store(tmp_path, "zero3.resumed", loss_curve=[*straight[:1], {"step": 15, "loss": 2.5}, straight[2]],
          resumed_from_step=12)  # fmt: skip
    store(tmp_path, "zero3.smaller", loss_curve=straight, resumed_from_step=10)
    rows = [row.strip("| ").split(" | ") for row in tables.resume_steps(tmp_path, []).splitlines()[2:]]
    assert rows == [
        ["zero3", "15", "3.00000", "2.50000 (shorter window)", "3.00000"],
        ["zero3", "20", "2.00000", "2.00000", "2.00000"],
    ]


def test_two_launchers_eval_loss_is_compared_with_one_launchers(tmp_path):
    store(tmp_path, "zero3.one-launcher", eval_loss=3.0, status="completed")
    store(tmp_path, "zero3.two-launchers", eval_loss=3.5, status="completed")
    last = tables.two_launchers(tmp_path, ["zero3"]).splitlines()[-1]
    assert last.strip("| ").split(" | ")[-1] == "5.00e-01"


def table_cells(table: str) -> list[list[str]]:
    """Each body row of a markdown table as its cells."""
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in table.splitlines()[2:]]


def floor_case(
    call: Path, name: str, rate: float | None, peak: float | None, status: str = "completed", **fields: Any
) -> None:
    """One floor.sh case folder with the fields the floor tables read."""
    (call / name).mkdir(parents=True)
    summary = {"model": "m", "status": status, "tokens_per_second_per_device": rate, "mfu": 0.1,
               "memory_peak_allocated_gib_max": peak, "step_time_median_s": 0.5, "micro_batch_size": 8,
               "gradient_accumulation_steps": 1, "loss_curve": FALLING, **fields}  # fmt: skip
    (call / name / "run_summary.json").write_text(json.dumps(summary))


def test_floor_against_sets_each_case_beside_its_own_profiles_reference_over_pooled_repeats(tmp_path):
    floor_case(tmp_path / "call1", "fsdp_--batch_size_8", 100.0, 10.0)
    floor_case(tmp_path / "call2", "fsdp_--batch_size_8_r2", 120.0, 10.0)
    floor_case(tmp_path / "call1", "fsdp_--peft_lora_--batch_size_16", 132.0, 6.0)
    floor_case(tmp_path / "call1", "zero3_--batch_size_8", 50.0, 20.0)
    floor_case(tmp_path / "call1", "zero3_--peft_lora_--batch_size_16", 75.0, 12.0)
    rows = {cells[1]: cells[-2:] for cells in table_cells(tables.floor_against(tmp_path, ["--batch_size,8"]))}
    assert rows["`fsdp_--peft_lora_--batch_size_16`"] == ["1.20", "0.60"]  # 132 / median(100, 120)
    assert rows["`zero3_--peft_lora_--batch_size_16`"] == ["1.50", "0.60"]


def test_floor_against_sets_a_changed_profile_beside_the_profile_it_changes(tmp_path):
    blocks = "zero2_dynamo_config.dynamo_use_regional_compilation=true_--global_batch_size_64"
    floor_case(tmp_path / "call1", "zero2_--global_batch_size_64", 100.0, 10.0, strategy="zero2")
    floor_case(tmp_path / "call1", blocks, 150.0, 9.0, strategy="zero2")
    rows = {
        cells[1]: cells[-2:]
        for cells in table_cells(tables.floor_against(tmp_path, ["--global_batch_size,64"]))
    }
    assert rows[f"`{blocks}`"] == ["1.50", "0.90"]


def test_floor_against_no_flags_sets_each_case_beside_its_profiles_own_case(tmp_path):
    floor_case(tmp_path / "call1", "fsdp", 100.0, 10.0)
    floor_case(tmp_path / "call1", "fsdp_--fsdp_prefetch_1", 125.0, 10.0)
    rows = {cells[1]: cells[-2:] for cells in table_cells(tables.floor_against(tmp_path, []))}
    assert rows["`fsdp_--fsdp_prefetch_1`"] == ["1.25", "1.00"]


def test_floor_tables_read_a_machines_call_folders_not_the_call_scripts_beside_them(tmp_path):
    floor_case(tmp_path / "call1", "fsdp", 100.0, 10.0)
    floor_case(tmp_path / "call1", "fsdp_--fsdp_prefetch_1", 125.0, 10.0)
    (tmp_path / "call1.sh").write_text("bash benchmarks/run.sh floor ...\n")
    rows = {cells[1]: cells[-2:] for cells in table_cells(tables.floor_against(tmp_path, []))}
    assert rows["`fsdp_--fsdp_prefetch_1`"] == ["1.25", "1.00"]


def test_a_cases_folder_is_named_as_floor_sh_names_it():
    """floor.sh's own naming line, run: tables.py finds a reference case by the folder it writes."""
    naming = [
        line
        for line in (ROOT / "benchmarks" / "scripts" / "floor.sh").read_text().splitlines()
        if line.lstrip().startswith(("TAG=", "NAME="))
    ]
    case = "zero3:--peft,lora,--gradient_checkpointing,true,--torch_compile_mode,reduce-overhead"
    for written in (case, "fsdp:--batch_size,8", "fsdp#r2", f"{case}#r2"):
        script = "\n".join(["REST=$CASE", *naming, 'echo "$NAME"'])
        named = subprocess.run(["bash", "-c", script], env={"CASE": written},
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        assert tables.case_folder(written) == named
    assert (
        tables.case_folder(case)
        == "zero3_--peft_lora_--gradient_checkpointing_true_--torch_compile_mode_reduce-over"
    )


def test_a_long_cases_repeats_get_folders_of_their_own():
    quantized = "ds.zero_optimization.zero_quantized"
    case = f"zero3~{quantized}_weights=true~{quantized}_gradients=true"
    assert tables.case_folder(f"{case}#r2") == f"{tables.case_folder(case)}_r2"


def test_a_floor_case_that_failed_before_its_first_step_is_a_row_that_says_so(tmp_path):
    floor_case(tmp_path, "ddp", 100.0, 10.0)
    floor_case(tmp_path, "zero3_--torch_compile_mode_reduce-overhead", None, None, status="failed")
    failed = table_cells(tables.floor(tmp_path))[1]
    assert failed == ["`zero3_--torch_compile_mode_reduce-overhead`", *["n/a"] * 5, "failed"]


def test_a_bare_torch_loops_case_is_a_floor_row_beside_ddps(tmp_path):
    """bare_loop.py's JSON: torch's FSDP2 without finetune, set against the call's ddp."""
    floor_case(tmp_path, "ddp", 100.0, 10.0)
    (tmp_path / "bare_fsdp").mkdir()
    bare = {"tokens_per_second": 80.0, "peak_allocated_gib": 9.0, "step_time_median_s": 0.1,
            "loss_curve": FALLING}  # fmt: skip
    (tmp_path / "bare_fsdp" / "bare.json").write_text(json.dumps(bare))
    rows = {cells[0]: cells for cells in table_cells(tables.floor(tmp_path))}
    assert rows["`bare_fsdp`"][1:6] == ["80", "100", "9.0", "n/a", "80%"]


def bare_case(folder: Path, name: str, step_s: float, micro_batch: int = 8) -> None:
    """One bare_loop.py case folder with the fields the floor tables read."""
    (folder / name).mkdir(parents=True)
    bare = {"micro_batch": micro_batch, "block_size": 1024, "step_time_median_s": step_s,
            "tokens_per_second": 1.0, "peak_allocated_gib": 1.0, "loss_curve": FALLING}  # fmt: skip
    (folder / name / "bare.json").write_text(json.dumps(bare))


def test_floor_bare_sets_finetunes_median_step_beside_torch_alones_over_every_call_of_the_machine(tmp_path):
    """Cases at any depth below the machine pool by shape and profile; traced ones are left out."""
    for call, ours, alone in (("call1/b8", 0.13, 0.10), ("call2/b8", 0.15, 0.11), ("call3", 0.14, 0.12)):
        floor_case(tmp_path / call, "fsdp", 1.0, 1.0, block_size=1024, step_time_median_s=ours)
        bare_case(tmp_path / call, "bare_fsdp", alone)
    floor_case(tmp_path / "call1/b8", "ddp", 1.0, 1.0, block_size=1024, step_time_median_s=0.07)
    bare_case(tmp_path / "call1/b8", "bare_ddp", 0.055)
    floor_case(tmp_path / "call3", "trace_fsdp", 1.0, 1.0, block_size=1024, step_time_median_s=9.0)
    rows = {cells[1]: cells for cells in table_cells(tables.floor_bare(tmp_path))}
    assert list(rows) == ["`ddp`", "`fsdp`"]
    assert rows["`fsdp`"] == [
        "8 x 1024",
        "`fsdp`",
        "140 (3: 130-150)",
        "110 (3: 100-120)",
        "1.27",
        "0.50",
        "0.50",
    ]


def test_refresh_rewrites_each_marked_table_and_keeps_the_text_around_it(tmp_path):
    """instruction_lora prints two tables: both stale ones below its marker are replaced."""
    store(tmp_path, "plain_lora.llama.b8.run1", tokens_per_second=1.0)
    store(tmp_path, "finetune_lora.llama.b8.run1", tokens_per_second=2.0)
    store(tmp_path, "plain_instruction.gpt2.b8.run1", tokens_per_second=1.0)
    store(tmp_path, "finetune_instruction.gpt2.b8.run1", tokens_per_second=3.0)
    marker = f"<!-- table: python benchmarks/scripts/tables.py instruction_lora {tmp_path} -->"
    page = tmp_path / "page.md"
    page.write_text(f"Before.\n\n{marker}\n\n| old |\n|---|\n\n| old too |\n|---|\n\nAfter.\n")
    assert tables.main(["refresh", str(page)]) == 0
    printed = tables.instruction_lora(tmp_path)
    assert page.read_text() == f"Before.\n\n{marker}\n\n{printed}\n\nAfter.\n"


def test_an_unknown_table_kind_is_one_usage_line_and_exit_2(capsys):
    assert tables.main(["speeds", str(ROOT)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


RUNNER = ROOT / "benchmarks" / "run.sh"
LIVE_SCRIPTS = [RUNNER, *sorted((ROOT / "benchmarks" / "scripts").iterdir())]


def runner_commands() -> tuple[list[str], dict[str, str]]:
    """The commands run.sh's usage lists, and each dispatched command's line."""
    text = RUNNER.read_text()
    usage = text.split("<<'USAGE'\n", 1)[1].split("\nUSAGE", 1)[0].splitlines()[1:]
    listed = [line.split()[0] for line in usage if line.startswith("  ") and not line.startswith("   ")]
    dispatched = dict(re.findall(r"^  (\w+)\) (exec .*) ;;$", text, flags=re.MULTILINE))
    return listed, dispatched


def test_every_benchmark_command_the_runner_lists_is_dispatched_to_a_script_that_exists():
    listed, dispatched = runner_commands()
    assert listed == list(dispatched)
    for command, line in dispatched.items():
        script = re.search(r"\$SCRIPTS/(\S+)", line)[1]
        assert (ROOT / "benchmarks" / "scripts" / script).is_file(), command


def test_no_live_benchmark_script_runs_a_dated_folders_record():
    dated = re.compile(r"benchmarks/[a-z0-9]+-\d{4}-\d{2}-\d{2}\w*/\S+\.(sh|py)")
    for script in LIVE_SCRIPTS:
        assert not dated.search(script.read_text()), f"{script.name} runs a dated folder's file"


def test_every_benchmark_shell_script_parses():
    for script in [*ROOT.glob("benchmarks/**/*.sh")]:
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script


trace_analysis = load_script("trace_analysis")


def write_trace(folder: Path, rank: int, kernels: list[tuple[str, float, float, float]]) -> None:
    """A rank's Chrome trace: (name, host launch end, kernel start, kernel end) per kernel, in µs."""
    events = []
    for correlation, (name, launched, start, end) in enumerate(kernels):
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "tid": 1,
                "ts": launched - 5,
                "dur": 5,
                "args": {"correlation": correlation},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "tid": 7,
                "ts": start,
                "dur": end - start,
                "args": {"correlation": correlation},
            }
        )
    events.append(
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "FSDP::pre_forward (h.3)",
            "tid": 1,
            "ts": 0,
            "dur": 10_000,
        }
    )
    (folder / f"rank{rank}.trace.json").write_text(json.dumps({"traceEvents": events}))


def test_collectives_are_paired_across_ranks_by_end_time_and_the_last_to_arrive_is_named(tmp_path):
    gather = "ncclDevKernel_AllGather_RING_LL(x)"
    # rank 1 launches the all-gather 900 µs after rank 0 did; both end together at 1,100 µs
    write_trace(tmp_path, 0, [("gemm", 0, 10, 90), (gather, 100, 105, 1100)])
    write_trace(tmp_path, 1, [("gemm", 0, 10, 90), (gather, 995, 1000, 1101)])
    numbers = trace_analysis.analyse(tmp_path, steps=1)
    collectives = numbers["collectives"]
    assert collectives["paired"] == 1 and collectives["last_to_arrive"] == {"1": 1}
    assert collectives["why_last_was_late"] == {"host-late": 1}
    assert collectives["host_doing_before_late_launch"] == {"FSDP::pre_forward (h.N)": 1}
    all_gather = collectives["by_type"]["AllGather"]
    assert all_gather["median_wait_for_last_ms"] == 0.895
    assert abs(all_gather["median_transfer_after_last_arrival_ms"] - 0.1005) < 1e-3
    assert numbers["ranks"][0]["gpu_nccl_ms"] == 0.995


calibration_rows = load_script("calibration_rows")


def test_a_calls_versions_are_read_with_or_without_nccls():
    """floor.sh's gpu.txt names NCCL as a tuple; long_context.sh's leaves it out."""
    assert calibration_rows.versions_of("2.11.0+cu130 (2, 28, 9) 5.17.0 1.15.0 0.19.8") == (
        "torch 2.11.0+cu130, NCCL 2.28.9, transformers 5.17.0, accelerate 1.15.0, deepspeed 0.19.8"
    )
    assert calibration_rows.versions_of("2.11.0+cu130 5.17.0 1.15.0 0.19.8") == (
        "torch 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0, deepspeed 0.19.8"
    )


def test_calibrate_rows_name_the_versions_each_run_recorded():
    """calibrate.sh leaves no gpu.txt: a row's versions come from its own summary."""
    summary = {
        "torch_version": "2.11.0",
        "cuda_version": "13.0",
        "transformers_version": "5.17.0",
        "accelerate_version": "1.15.0",
        "deepspeed_version": "0.19.8",
    }
    assert calibration_rows.summary_versions(summary) == (
        "torch 2.11.0 (CUDA 13.0), transformers 5.17.0, accelerate 1.15.0, deepspeed 0.19.8"
    )
    cpu = {**summary, "cuda_version": None, "deepspeed_version": None}
    assert calibration_rows.summary_versions(cpu) == "torch 2.11.0, transformers 5.17.0, accelerate 1.15.0"


def test_python_self_time_is_named_with_its_callers():
    """Tensor.to's own time under two callers, the callers' own time with their callees taken out;
    with two levels, each caller's own caller too."""
    calls = [("step", 0, 100), ("send_to_device", 10, 30), ("to", 12, 22), ("clip", 50, 90), ("to", 60, 64)]
    events = [{"tid": 1, "name": name, "ts": start, "dur": end - start} for name, start, end in calls]
    assert trace_analysis.self_times(events, callers=1) == {
        "step <- (thread)": 0.04,
        "send_to_device <- step": 0.01,
        "to <- send_to_device": 0.01,
        "clip <- step": 0.036,
        "to <- clip": 0.004,
    }
    assert trace_analysis.self_times(events)["to"] == 0.014
    two_levels = trace_analysis.self_times(events, callers=2)
    assert two_levels["to <- send_to_device <- step"] == 0.01
    assert two_levels["send_to_device <- step <- (thread)"] == 0.01


def test_a_collective_whose_ends_differ_more_than_the_clocks_allow_is_left_unpaired(tmp_path):
    gather = "ncclDevKernel_AllGather_RING_LL(x)"
    write_trace(tmp_path, 0, [(gather, 100, 105, 1100)])
    write_trace(tmp_path, 1, [(gather, 100, 105, 5000)])
    assert trace_analysis.analyse(tmp_path, steps=1)["collectives"]["paired"] == 0


host_samples = load_script("host_samples")
LAUNCHER = 'process 10:"python torchrun bare_loop.py";'
RANK = LAUNCHER + 'process 11:"python -u bare_loop.py";thread (11);main (bare_loop.py:154);'
STEP = "main.<locals>.step (bare_loop.py:144);"
SAMPLED = [
    LAUNCHER + "thread (10);main (torch/distributed/run.py:900) 500",
    RANK + STEP + "FSDPState._pre_forward (torch/distributed/fsdp/_fully_shard/_fsdp_state.py:230) 30",
    RANK + STEP + "Optimizer.step (torch/optim/optimizer.py:500);_fused_adamw (torch/optim/adamw.py:700) 10",
    RANK + STEP + "_compile (torch/_dynamo/convert_frame.py:900);compile_fx (torch/_inductor/x.py:1) 400",
    RANK + "build_model (bare_loop.py:90) 50",
    "    import torch  # a piece of a worker's command line",
]


def test_host_samples_count_a_ranks_training_loop_without_its_compilation_and_leave_the_launcher_out():
    [(pid, stacks)] = host_samples.rank_samples(SAMPLED).items()
    summary = host_samples.summarize(stacks, rate=100, steps=2)
    assert pid == "11"
    assert (summary["loop_samples"], summary["compiling_samples"]) == (40, 400)
    assert summary["host_ms_per_step"] == 200.0  # 40 samples at 100 Hz over 2 steps


TRAINER = 'process 20:"python run.py";thread (20);Trainer._inner_training_loop (transformers/trainer.py:1);'
TRAINER_SAMPLED = [
    TRAINER + "Trainer._run_epoch (transformers/trainer.py:2);DeepSpeedEngine.step (deepspeed/e.py:3) 12",
    TRAINER + "Trainer._prepare_for_training (transformers/trainer.py:4);Accelerator.prepare (a.py:5) 300",
    TRAINER + "CallbackHandler.on_train_begin (transformers/trainer_callback.py:6) 50",
    TRAINER + "Accelerator.free_memory (accelerate/accelerator.py:7) 40",
]


def test_host_samples_of_a_finetune_rank_leave_out_what_the_trainer_does_once_around_its_epochs():
    """DeepSpeed's engine is built, and callbacks start, inside the Trainer's `_inner_training_loop`:
    spread over the steps, a run's start-up would read as each step's host time."""
    [stacks] = host_samples.rank_samples(TRAINER_SAMPLED).values()
    summary = host_samples.summarize(stacks, rate=100, steps=2)
    assert summary["loop_samples"] == 12
    assert summary["share_by_category"] == {"DeepSpeed": 1.0}


def test_host_samples_share_the_loop_by_what_each_sample_was_inside_and_name_the_self_time():
    [stacks] = host_samples.rank_samples(SAMPLED).values()
    summary = host_samples.summarize(stacks, rate=100, steps=2)
    assert summary["share_by_category"] == {"FSDP2 hooks and collectives": 0.75, "optimizer step": 0.25}
    assert summary["top_self"] == [
        ["FSDPState._pre_forward (torch/distributed/fsdp/_fully_shard/_fsdp_state.py)", 0.75],
        ["_fused_adamw (torch/optim/adamw.py)", 0.25],
    ]
    assert summary["top_inclusive"] == [
        ["FSDPState._pre_forward (torch/distributed/fsdp/_fully_shard/_fsdp_state.py)", 0.75],
        ["Optimizer.step (torch/optim/optimizer.py)", 0.25],
        ["_fused_adamw (torch/optim/adamw.py)", 0.25],
    ]


GPU_RANK = 'process 30:"python run.py";'
GPU_LOOP = (
    GPU_RANK + "thread (0x1A): MainThread;<module> (run.py:1);Trainer._run_epoch (transformers/trainer.py:2);"
)
AUTOGRAD = GPU_RANK + "thread (0x2B);"  # autograd's worker: started by torch's C++, no Python root
GPU_SAMPLED = [
    GPU_LOOP + "Tensor.backward (torch/_tensor.py:3) 10",
    GPU_RANK
    + "thread (0x1A): MainThread;<module> (run.py:1);Trainer.evaluate (transformers/trainer.py:4) 70",
    AUTOGRAD
    + "reduce_leaf_module_grads (deepspeed/runtime/zero/stage3.py:5);partition_grads (deepspeed/z.py:6) 30",
    AUTOGRAD + "CompiledFunction.backward (torch/_functorch/_aot_autograd/runtime_wrappers.py:7) 10",
    AUTOGRAD + "compile_fx (torch/_inductor/compile_fx.py:8) 500",
    GPU_RANK + "thread (0x3C): pin_memory;Thread._bootstrap (threading.py:9);_pin_memory_loop (p.py:10) 90",
]


def test_host_samples_count_autograds_backward_thread_apart_from_the_loop_and_from_pythons_own_threads():
    """On a GPU the gradient hooks run on autograd's worker thread while the loop's thread waits
    unsampled: without it, a hook-bound step reads as idle host time."""
    [stacks] = host_samples.rank_samples(GPU_SAMPLED).values()
    summary = host_samples.summarize(stacks, rate=100, steps=2)
    backward = summary["backward_thread"]
    assert (summary["loop_samples"], summary["host_ms_per_step"]) == (10, 50.0)
    assert (backward["samples"], backward["host_ms_per_step"]) == (40, 200.0)
    assert summary["compiling_samples"] == 500  # the backward's compilation, on its thread
    assert backward["share_by_category"] == {
        "DeepSpeed": 0.75,
        "compiled regions (guards, wrappers, launches)": 0.25,
    }
    assert backward["top_self"][0] == ["partition_grads (deepspeed/z.py)", 0.75]


COMPILED_STEP = GPU_LOOP + "CompiledFxGraph.__call__ (torch/_inductor/output_code.py:1);"
COMPILED_SAMPLED = [
    COMPILED_STEP + "align_inputs_from_check_idxs.<locals>.run (torch/_inductor/utils.py:3401) 20",
    COMPILED_STEP + "call (/tmp/torchinductor_root/ab/cab.py:9);CachingAutotuner.run "
    "(torch/_inductor/runtime/triton_heuristics.py:1300) 10",
    COMPILED_STEP + "cudagraphify.<locals>.run (torch/_inductor/compile_fx.py:1875);CUDAGraphTreeManager.run "
    "(torch/_inductor/cudagraph_trees.py:1);CUDAGraphTreeManager.execute_node (torch/_inductor/x.py:2) 6",
    COMPILED_STEP + "CUDAGraphTreeManager.record_function (torch/_inductor/cudagraph_trees.py:3) 50",
    GPU_LOOP + "_compile (torch/_dynamo/convert_frame.py:900);compile_fx (torch/_inductor/x.py:1) 400",
    AUTOGRAD + "CompiledFunction.backward (torch/_functorch/_aot_autograd/runtime_wrappers.py:7);"
    "compile_fx_inner (torch/_inductor/compile_fx.py:8) 300",
    GPU_LOOP + "CachingAutotuner.benchmark_all_configs (torch/_inductor/runtime/triton_heuristics.py:1) 5",
]


def test_host_samples_count_a_compiled_graphs_run_as_the_step_and_only_its_compilation_as_compiling():
    """Inductor's runtime (the graph's input alignment, its kernels' launchers) lives under
    torch/_inductor too: each steady step runs it, so it is the step's host time, not compilation."""
    [stacks] = host_samples.rank_samples(COMPILED_SAMPLED).values()
    summary = host_samples.summarize(stacks, rate=100, steps=1)
    assert (summary["loop_samples"], summary["compiling_samples"]) == (36, 755)


def test_host_samples_count_the_batches_copies_and_not_the_forward_accelerate_wraps_to_cast_its_outputs():
    operations = "(accelerate/utils/operations.py:931);"
    wrapped = [
        GPU_LOOP + "ConvertOutputsToFp32.__call__ " + operations + "GPT2LMHeadModel.forward (m.py:1) 30",
        GPU_LOOP
        + "DataLoaderShard.__iter__ (accelerate/data_loader.py:2);send_to_device "
        + operations
        + "Tensor.to (torch/_tensor.py:3) 10",
    ]
    [stacks] = host_samples.rank_samples(wrapped).values()
    shares = host_samples.summarize(stacks, rate=100, steps=1)["share_by_category"]
    assert shares["batches (data loader, copies)"] == 0.25


def test_host_samples_time_the_functions_named_by_the_end_of_their_frames_name_on_each_thread():
    [stacks] = host_samples.rank_samples(GPU_SAMPLED).values()
    summary = host_samples.summarize(
        stacks, rate=100, steps=2, functions=("reduce_leaf_module_grads", "backward")
    )
    assert summary["inside"] == {"reduce_leaf_module_grads": 0.0, "backward": 50.0}  # Tensor.backward
    assert summary["backward_thread"]["inside"] == {"reduce_leaf_module_grads": 150.0, "backward": 50.0}


def test_floor_inside_leaves_out_the_cases_not_asked_to_time_functions(tmp_path):
    timed = {"host_ms_per_step": 40.0, "inside": {"step": 15.0}, "backward_thread": {"inside": {"step": 1.0}}}
    for case, rank in (("SPY=1_zero3", timed), ("SPY=1_single", {"host_ms_per_step": 41.0})):
        (tmp_path / case).mkdir()
        (tmp_path / case / "host_samples.json").write_text(json.dumps({"ranks": {"7": rank}}))
    assert table_cells(tables.floor_inside(tmp_path)) == [["`SPY=1_zero3`", "40.0", "16.0"]]


def test_floor_inside_reads_na_for_a_case_whose_samples_found_no_rank_in_the_loop(tmp_path):
    timed = {"host_ms_per_step": 40.0, "inside": {"step": 15.0}}
    for case, ranks in (("SPY=1_zero3", {"7": timed}), ("SPY=1_zero3_r2", {})):
        (tmp_path / case).mkdir()
        (tmp_path / case / "host_samples.json").write_text(json.dumps({"ranks": ranks}))
    assert table_cells(tables.floor_inside(tmp_path)) == [
        ["`SPY=1_zero3`", "40.0", "15.0"],
        ["`SPY=1_zero3_r2`", "n/a", "n/a"],
    ]


NATIVE_RANK = 'process 40:"run.py";'
NATIVE_LOOP = NATIVE_RANK + "thread (40);_start (python3);Trainer._run_epoch (transformers/trainer.py:2);"
NATIVE_WORKER = NATIVE_RANK + "thread (41);run (libc.so);torch::autograd::Engine::thread_main (libtorch.so);"
NATIVE_SAMPLED = [
    NATIVE_LOOP + "DeepSpeedEngine.forward (deepspeed/runtime/engine.py:3) 30",
    NATIVE_LOOP + "Runner.call (/tmp/x.py:4);cuLaunchKernel (libcuda.so.580.1) 10",
    NATIVE_WORKER + "torch::autograd::Node::operator() (libtorch_cpu.so) 5",
    NATIVE_WORKER + "partition_grads (deepspeed/runtime/zero/stage3.py:5) 15",
    NATIVE_RANK + "thread (42): watchdog;start_thread (libc.so.6);Thread._bootstrap (threading.py:6) 3",
]


def test_a_native_window_shows_each_threads_share_of_the_ticks_and_what_python_sampling_misses(tmp_path):
    """With --native every thread has a C++ root: autograd's worker is known by its engine frame, and
    Python's own threads (the watchdog) stay out of it."""
    (tmp_path / "SPY_NATIVE=1_zero3").mkdir()
    stacks = tmp_path / "stacks.raw"
    stacks.write_text("\n".join(NATIVE_SAMPLED) + "\n")
    out = tmp_path / "SPY_NATIVE=1_zero3" / "native_samples.json"
    assert host_samples.main(["--window", "1", str(stacks), "100", str(out)]) == 0
    [row] = table_cells(tables.floor_native(tmp_path))
    assert row[:8] == ["`SPY_NATIVE=1_zero3`", "0.40", "0.20", "0.60", "0.00", "0.25", "0.25", "0.00"]


PY_SPY_LOG = """py-spy> Sampling process 200 times a second. Press Control-C to exit.
py-spy> 2.42s behind in sampling, results may be inaccurate. Try reducing the sampling rate
py-spy> 0.5s behind in sampling, results may be inaccurate. Try reducing the sampling rate
  throughput  50,096 tokens/s (50,096 per device), step 0.164 s median
py-spy> Wrote raw flamegraph data to '/tmp/floor/SPY=1_zero3.stacks'. Samples: 8000 Errors: 1000
"""


def test_host_samples_read_py_spys_own_count_of_its_samples_and_read_errors_from_the_cases_log(tmp_path):
    (tmp_path / "log").write_text(PY_SPY_LOG)
    assert host_samples.sampler_report(tmp_path) == {"samples": 8000, "errors": 1000, "most_behind_s": 2.42}
    (tmp_path / "log").write_text("a run without py-spy\n")
    assert host_samples.sampler_report(tmp_path) == {}


def test_floor_spy_shows_the_samples_py_spy_lost_where_its_count_was_read(tmp_path):
    rank = {"host_ms_per_step": 57.3, "share_by_category": {}, "top_self": []}
    for case, sampler in (("SPY=1_zero3", {"samples": 8000, "errors": 960}), ("SPY=1_single", {})):
        floor_case(tmp_path, case, 1.0, 1.0, step_time_median_s=0.164)
        samples = {"sampler": sampler, "ranks": {"7": rank}}
        (tmp_path / case / "host_samples.json").write_text(json.dumps(samples))
    table = tables.floor_spy(tmp_path)
    assert table.splitlines()[0].endswith("| py-spy's samples lost to read errors |")
    assert [cells[-1] for cells in table_cells(table)] == ["n/a", "12%"]


def test_floor_spy_sets_each_sampled_cases_host_time_a_step_beside_its_step_and_shares_per_rank(tmp_path):
    def sampled(name: str, shares: dict[str, float]) -> dict:
        rank = {"host_ms_per_step": 90.4, "share_by_category": shares, "top_self": [[name, 0.2]]}
        return {"ranks": {"11": rank, "12": {**rank, "host_ms_per_step": 80.0}}}

    floor_case(tmp_path, "SPY=1_fsdp", 1.0, 1.0, step_time_median_s=0.1)
    (tmp_path / "SPY=1_fsdp" / "host_samples.json").write_text(
        json.dumps(sampled("hook (fsdp.py)", {"FSDP2 hooks and collectives": 0.5}))
    )
    bare_case(tmp_path, "SPY=1_bare_fsdp", 0.08)
    (tmp_path / "SPY=1_bare_fsdp" / "host_samples.json").write_text(
        json.dumps(sampled("step (adam.py)", {"optimizer step": 0.25}))
    )
    floor_case(tmp_path, "fsdp", 1.0, 1.0)  # not sampled: no row
    rows = table_cells(tables.floor_spy(tmp_path))
    assert rows == [
        ["`SPY=1_bare_fsdp`", "80", "90, 80", "0.00/0.00", "0.00/0.00", "0.00/0.00", "0.25/0.25", "0.00/0.00",
         "step (adam.py) (0.20)"],
        ["`SPY=1_fsdp`", "100", "90, 80", "0.50/0.50", "0.00/0.00", "0.00/0.00", "0.00/0.00", "0.00/0.00",
         "hook (fsdp.py) (0.20)"],
    ]  # fmt: skip


def test_floor_spy_adds_the_backward_threads_host_time_where_the_samples_counted_it(tmp_path):
    backward = {"host_ms_per_step": 120.4, "top_self": [["partition_grads (deepspeed/z.py)", 0.4]]}
    rank = {"host_ms_per_step": 60.0, "share_by_category": {}, "top_self": [], "backward_thread": backward}
    floor_case(tmp_path, "SPY=1_zero3", 1.0, 1.0, step_time_median_s=0.18)
    (tmp_path / "SPY=1_zero3" / "host_samples.json").write_text(json.dumps({"ranks": {"30": rank}}))
    table = tables.floor_spy(tmp_path)
    assert "backward thread's host ms a step (each rank)" in table.splitlines()[0]
    assert table_cells(table)[0][-2:] == ["120", "partition_grads (deepspeed/z.py) (0.40)"]


def test_host_samples_count_the_steps_each_case_recorded_bare_loops_warm_up_steps_among_them(tmp_path):
    floor_case(tmp_path, "SPY=1_fsdp", 1.0, 1.0, steps=40)
    bare_case(tmp_path, "SPY=1_bare_fsdp", 0.08)
    bare = tmp_path / "SPY=1_bare_fsdp" / "bare.json"
    bare.write_text(json.dumps({**json.loads(bare.read_text()), "steps": 40, "warmup": 5}))
    assert host_samples.loop_steps(tmp_path / "SPY=1_fsdp") == 40
    assert host_samples.loop_steps(tmp_path / "SPY=1_bare_fsdp") == 45
