"""docs/ and benchmarks/: every figure a page shows is generated from a stored result, and every
pointer to a benchmarks/ folder leads to one.

A table of results in docs/ or the README is preceded by the line `<!-- table: python
benchmarks/scripts/tables.py KIND benchmarks/PATH -->`; what follows must be what that command prints,
so a table is changed by rerunning the command, never by hand.
"""

import json
import re
import subprocess
from pathlib import Path

import pytest

from finetune.run_report import format_report

from benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SPEED_PAGE = ROOT / "docs" / "speed.md"
PLANNER_PAGE = ROOT / "docs" / "planner.md"
TROUBLESHOOTING_PAGE = ROOT / "docs" / "troubleshooting.md"
RESUME_PAGE = ROOT / "docs" / "resume-export-eval-generate.md"
LONG_CONTEXT_PAGE = ROOT / "docs" / "long-context.md"
README = ROOT / "README.md"
TABLE_SCRIPT = "benchmarks/scripts/tables.py"
GENERATED_TABLE = re.compile(rf"<!-- table: python {TABLE_SCRIPT} (\w+) (benchmarks/\S+(?: [^ >]+)*) -->")
REPORT_SUMMARY = "benchmarks/h200-2026-11-24e/finetune.gpt2-medium.b8.run1.json"


def generated_tables(page: Path) -> list[tuple[str, str, str]]:
    """(kind, path and any further arguments, the table that follows the marker) for every generated
    table of a page."""
    text = page.read_text()
    tables = []
    for found in GENERATED_TABLE.finditer(text):
        tables.append((found.group(1), found.group(2), text[found.end() :].lstrip("\n")))
    return tables


PAGES = (SPEED_PAGE, README, PLANNER_PAGE, TROUBLESHOOTING_PAGE, RESUME_PAGE, LONG_CONTEXT_PAGE)
TABLES = [table for page in PAGES for table in generated_tables(page)]


def test_docs_speed_page_has_its_generated_tables():
    assert len(generated_tables(SPEED_PAGE)) == 105


def test_the_planner_page_shows_its_several_gpu_tables_generated():
    assert [folder for _, folder, _ in generated_tables(PLANNER_PAGE)] == [
        "benchmarks/h100-2026-12-05b/call3/fsdp",
        "benchmarks/h100-2026-12-05b/call3/fsdp_grad_op",
        "benchmarks/h200-2026-11-29e/call1",
        "benchmarks/h200-2026-11-29e/call2",
        "benchmarks/h200-2026-11-29e/call4",
        "benchmarks/h200-2026-12-02/call5",
        "benchmarks/h200-2026-12-02/call3",
        "benchmarks/h200-2026-12-02/call4",
        "benchmarks/h200-2026-12-02e/call1",
        "benchmarks/h200-2026-12-02e/call2",
        "benchmarks/h200-2026-12-02e/call3/long",
        "benchmarks/h200-2026-12-02c",
        "benchmarks/h200-2026-12-02d/call3",
        "benchmarks/h200-2026-12-02b/call4",
        "benchmarks/cpu-2026-12-05-float8",
        "benchmarks/h200-2026-12-05/call2/medium",
        "benchmarks/h200-2026-12-05/call2/xl",
        "benchmarks/h100-2026-12-05b/call1/medium",
        "benchmarks/h100-2026-12-05b/call1/xl",
        "benchmarks/h100-2026-12-05b/call1/llama",
        "benchmarks/h100-2026-12-05b/call2/llama",
        "benchmarks/h100-2026-12-05b/call2/llama_fsdp",
        "benchmarks/h100-2026-12-05b/call4/gpt2-medium",
        "benchmarks/h100-2026-12-05c/call1/fp8",
        "benchmarks/h200x4-2026-11-28c/call1",
        "benchmarks/h200-2026-11-29d/call1",
        "benchmarks/h200-2026-11-29d/call2",
        "benchmarks/h200-2026-11-29d/call4",
        "benchmarks/h200-2026-12-02/call1",
        "benchmarks/h200-2026-12-02/call2",
        "benchmarks/h100x4-2026-11-26/call1",
        "benchmarks/h100x2-2026-11-26",
        "benchmarks/h100x4-2026-11-27b",
        "benchmarks/h200x2-2026-11-29/call3",
        "benchmarks/h200x2-2026-11-28/call3",
        "benchmarks/h200x2-2026-11-30/call1/llama-zero3",
        "benchmarks/h200-2026-11-30b/call1/full",
        "benchmarks/h200-2026-11-30b/call1/lora",
        "benchmarks/h200-2026-11-30b/call2/lora_m",
        "benchmarks/h200x2-2026-11-28/call1",
        "benchmarks/h200x2-2026-11-30c",
        "benchmarks/h200x2-2026-11-30d",
        "benchmarks/h200x2-2026-11-30e",
        "benchmarks/h200x2-2026-12-01/a/call2",
        "benchmarks/h200x2-2026-12-01/a/call3",
        "benchmarks/h200-2026-12-01/call1/cal-xl",
        "benchmarks/h200-2026-12-01/call2/cal-llama",
        "benchmarks/h200-2026-12-01b/call2/m",
        "benchmarks/h200-2026-12-01b/call2/l",
        "benchmarks/h200-2026-12-01c/call1/m16",
        "benchmarks/h200-2026-12-01c/call1/xl32",
        "benchmarks/h200-2026-12-01c/call1/l8",
        "benchmarks/h200-2026-12-01c/call2/q8",
        "benchmarks/h200-2026-12-01d/call2/b32",
        "benchmarks/h200-2026-12-01d/call2/l16",
        "benchmarks/h200-2026-12-01h/call1",
        "benchmarks/h200-2026-12-01h/call2",
        "benchmarks/h200-2026-12-05/call1/large32",
        "benchmarks/h200-2026-12-05/call1/large16",
        "benchmarks/h200-2026-12-05/call1/xl8",
        "benchmarks/h100-2026-12-06b/call1",
        "benchmarks/h100-2026-12-06b/call2",
        "benchmarks/h200-2026-11-29/call1",
        "benchmarks/h200-2026-11-29c/call6",
        "benchmarks/h200-2026-11-29c/call7",
        "benchmarks/h200-2026-11-29d/call3",
    ]


def test_the_planner_page_counts_the_calibration_rows_there_are():
    calibration = json.loads((ROOT / "finetune" / "calibration.json").read_text())
    rows = calibration["measurements"]
    by_gpus = ", ".join(str(sum(1 for row in rows if row["gpus"] == gpus)) for gpus in (1, 2, 4))
    compiled = sum(1 for row in rows if row.get("compiled"))
    lora = sum(1 for row in rows if row.get("peft"))
    checkpointed = sum(1 for row in rows if row["gradient_checkpointing"])
    float8 = sum(1 for row in rows if row.get("fp8"))
    counts = (
        f"{len(rows)} training peaks on 1, 2 and 4 GPUs ({by_gpus}; {compiled} compiled, "
        f"{lora} with LoRA or DoRA, {checkpointed} checkpointed, {float8} with --fp8), "
        f"{len(calibration['with_accumulation'])} with gradient accumulation, "
        f"{len(calibration['long_blocks'])} long checkpointed blocks and "
        f"{len(calibration['out_of_memory'])} runs that ran out of memory"
    )
    assert {row["gpus"] for row in rows} == {1, 2, 4}
    assert counts in " ".join(PLANNER_PAGE.read_text().split())


def test_the_resume_page_shows_resume_on_half_the_gpus_generated():
    """4 -> 2 and 2 -> 1, each with every logged loss after the resume point."""
    assert [kind for kind, _, _ in generated_tables(RESUME_PAGE)] == ["resume", "resume_steps"] * 2


def test_readme_shows_the_doctor_instruction_and_lora_tables_generated():
    assert [folder for _, folder, _ in generated_tables(README)] == [
        "benchmarks/h100x4-2026-11-26b/doctor/ddp-4.json",
        "benchmarks/h100-2026-11-25/gsm8k",
        "benchmarks/h100-2026-11-25/cuda_graphs",
    ]


def test_troubleshooting_starts_from_doctor_tables_generated_on_cpu_and_gpus():
    assert [folder for _, folder, _ in generated_tables(TROUBLESHOOTING_PAGE)] == [
        "benchmarks/cpu-2026-11-26-doctor/ddp-2.json",
        "benchmarks/h100x2-2026-11-26b/doctor/ddp-2.json",
        "benchmarks/h100x2-2026-11-26b/doctor/zero3_nvme-2.json",
        "benchmarks/h100x2-2026-11-26b/doctor",
        "benchmarks/h100x4-2026-11-26b/doctor",
        "benchmarks/h200x2-2026-11-26/doctor",
    ]


def test_every_page_with_a_generated_table_is_checked():
    marked = {page for page in [README, *(ROOT / "docs").glob("*.md")] if "<!-- table:" in page.read_text()}
    assert marked == set(PAGES)


def test_every_table_marker_names_the_table_script():
    for page in PAGES:
        markers = re.findall(r"<!-- table: .*-->", page.read_text())
        assert len(markers) == len(generated_tables(page)), f"{page.name}: a marker not naming {TABLE_SCRIPT}"


@pytest.fixture(scope="module")
def tables_script():
    """tables.py imported into this process: a subprocess per table spent most of this file's time
    importing."""
    return load_script("tables")


@pytest.mark.parametrize(("kind", "folder", "table"), TABLES, ids=[folder for _, folder, _ in TABLES])
def test_a_pages_table_is_the_one_generated_from_the_stored_results(kind, folder, table, tables_script):
    path, *arguments = folder.split()
    printed = tables_script.table_for([kind, str(ROOT / path), *arguments]).strip()
    assert table.startswith(printed + "\n"), f"stale: rerun python {TABLE_SCRIPT} {kind} {folder}"


def test_the_measurements_page_end_of_run_block_is_a_stored_summary_formatted():
    report = format_report(json.loads((ROOT / REPORT_SUMMARY).read_text()))
    block = "\n".join(f"    {line}" for line in report.splitlines())
    assert block in (ROOT / "docs" / "measurements.md").read_text()


def test_the_tests_readme_names_every_module_and_only_test_files_that_exist():
    text = (ROOT / "tests" / "README.md").read_text()
    by_module = text.split("## Where a module is tested", 1)[1]
    listed = set(re.findall(r"^\| `([\w/]+)\.py` \|", by_module, flags=re.MULTILINE))
    package = ROOT / "finetune"
    modules = {path.relative_to(package).with_suffix("").as_posix() for path in package.rglob("*.py")}
    assert listed == {module for module in modules if not module.endswith("__init__")}
    named = set(re.findall(r"\b(test_\w+)\.py", text))
    assert named and sorted(name for name in named if not (ROOT / "tests" / f"{name}.py").is_file()) == []


def test_every_picture_the_readme_and_docs_show_exists():
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    shown = [
        (page, target) for page in pages for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())
    ]
    assert shown, "no picture is shown: the pattern is wrong"
    assert [(page.name, target) for page, target in shown if not (page.parent / target).is_file()] == []


def test_every_benchmarks_folder_the_docs_and_code_name_exists():
    sources = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "finetune").glob("*.py")]
    sources.append(ROOT / "finetune" / "calibration.json")
    named = {
        name
        for source in sources
        for name in re.findall(r"benchmarks/([\w.-]+)", source.read_text())
        if name not in ("README.md", "run.sh", "scripts")
    }
    assert named, "no benchmarks/ folder is named: the pattern is wrong"
    assert sorted(name for name in named if not (ROOT / "benchmarks" / name).is_dir()) == []


def test_the_benchmarks_readme_has_a_row_for_every_results_folder():
    listed = (ROOT / "benchmarks" / "README.md").read_text()
    folders = [path.name for path in (ROOT / "benchmarks").iterdir() if (path / "NOTES.md").exists()]
    assert folders
    assert [name for name in folders if f"| `{name}/` |" not in listed] == []


def test_no_file_points_at_the_former_gpu_folder_under_tests():
    sources = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "finetune").glob("*.py")]
    sources += [ROOT / "finetune" / "calibration.json", *(ROOT / "notebooks").glob("*.ipynb")]
    assert [source.name for source in sources if "tests/gpu" in source.read_text()] == []


def test_the_readme_test_command_is_the_one_ci_runs():
    readme = (ROOT / "README.md").read_text()
    command = readme.split("<!-- readme-test: skip the test suite itself -->")[1].strip().splitlines()[0]
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert [re.sub(r"^([A-Z_]+=\S+ )+", "", line) for line in ci_lines] == [command.strip()]


def test_makefile_test_target_runs_the_readme_test_command():
    makefile = (ROOT / "Makefile").read_text()
    assert "\ntest:\n\tpython -m pytest tests\n" in makefile


def benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    entry_point = ROOT / "benchmarks" / "run.sh"
    return subprocess.run(["bash", str(entry_point), *args], capture_output=True, text=True)


def test_benchmark_entry_point_refuses_a_command_without_out():
    result = benchmark("speed", "gpt2-medium", "8", "20", "plain")
    assert result.returncode == 2 and "needs --out DIR" in result.stderr


def test_benchmark_entry_point_refuses_an_unknown_command(tmp_path):
    result = benchmark("fastest", "--out", str(tmp_path))
    assert result.returncode == 2 and "unknown command 'fastest'" in result.stderr


def test_every_benchmark_script_the_entry_point_names_exists():
    scripts = set(re.findall(r"\$SCRIPTS/(\S+?\.(?:sh|py))", (ROOT / "benchmarks" / "run.sh").read_text()))
    assert scripts, "benchmarks/run.sh names no script"
    assert sorted(name for name in scripts if not (ROOT / "benchmarks" / "scripts" / name).is_file()) == []


def test_no_module_of_the_package_cites_a_dated_benchmarks_folder():
    """Measurements live in benchmarks/ and docs/; code says why and points to the page."""
    dated = re.compile(r"\b[a-z0-9]+-20\d\d-\d\d-\d\d[a-z]?\b")
    citing = [path.name for path in (ROOT / "finetune").rglob("*.py") if dated.search(path.read_text())]
    assert citing == []


def test_the_pages_state_targets_and_results_without_issue_numbers():
    """A reader of the docs has no issue tracker: a target is named for what it asks."""
    pages = [README, ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")]
    citing = [page.name for page in pages if re.search(r"\bissues? \d+", page.read_text(), re.IGNORECASE)]
    assert citing == []


def test_the_readme_layout_lists_every_module_of_the_package_once():
    listed = re.findall(r"^      ([\w/]+\.py) ", README.read_text(), re.M)
    package = ROOT / "finetune"
    modules = sorted(
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )
    assert sorted(listed) == modules
