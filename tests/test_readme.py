"""The README and docs/ as a user reads them: their commands run as printed.

Commands are the indented code blocks of README.md and docs/*.md that start a command (`finetune`,
`accelerate`, `python`, `make`, ...). Each command block is preceded by one marker line (an HTML
comment, invisible when rendered) that says how this test checks it:

    <!-- readme-test: run -->          run every line in a temporary copy of the project, with the
                                       documented offline set-up (../shared/data beside it); CPU, seconds
    <!-- readme-test: parse -->        needs GPUs, nodes or hours: every `finetune` and
                                       `accelerate launch` command's flags go through the real parsers
                                       (`[...]` optional parts and `|` alternatives are left out)
    <!-- readme-test: skip REASON -->  not a command of this project (pip, sbatch, tensorboard)

A command block without a marker fails the test, so a new command is never left unchecked. The
generated tables of docs/ are checked in tests/test_docs.py and tests/test_summary.py.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launching import ENVIRONMENT

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- readme-test: (run|parse|skip)\b(.*?)-->")
COMMAND_WORDS = (
    "finetune",
    "accelerate",
    "python",
    "python3",
    "pip",
    "sbatch",
    "tensorboard",
    "bash",
    "make",
    "FINETUNE_DATA_DIR=",
)
RUN_TIMEOUT_S = 300
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def command_blocks(document: Path) -> list[tuple[str, str, str]]:
    """('file:line', marker or '', the block's text) for every indented block that holds a command."""
    lines = document.read_text().splitlines()
    where = document.relative_to(ROOT)
    blocks, marker, number = [], "", 0
    while number < len(lines):
        line = lines[number]
        found = MARKER.search(line)
        if found:
            marker = found.group(1)
        if line.startswith("    ") and (number == 0 or not lines[number - 1].strip()):
            start = number
            while number < len(lines) and (lines[number].startswith("    ") or not lines[number].strip()):
                number += 1
            text = "\n".join(lines[start:number]).strip("\n")
            if starts_a_command(text):
                blocks.append((f"{where}:{start + 1}", marker, text))
            marker = ""
            continue
        if line.strip() and not found:
            marker = "" if not line.startswith("<!--") else marker
        number += 1
    return blocks


def starts_a_command(block: str) -> bool:
    """Program output and file listings are indented blocks too; a command block starts a known command."""
    try:
        return any(argv[0] in COMMAND_WORDS for argv in commands_of(block))
    except ValueError:  # unbalanced quotes: prose or output, not a command
        return False


def commands_of(block: str) -> list[list[str]]:
    """Each command of a block as argv: continuations joined, `&&` chains split, `VAR=x` prefixes and
    `[...]` optional parts left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        for part in re.sub(r"\[[^\]]*\]", " ", line).split("&&"):
            argv = shlex.split(part, comments=True)
            while argv and re.match(r"^[A-Z_]+=", argv[0]):
                argv = argv[1:]
            if argv:
                commands.append(argv)
    return commands


def parse_run_flags(flags: list[str]) -> None:
    """Run flags, a recipe first if any: its path is read from the project root, where the README runs."""
    from finetune.arguments import expand_recipe, make_parser

    if flags and flags[0].endswith((".yaml", ".yml")):
        flags = [str(ROOT / flags[0]), *flags[1:]]
    make_parser().parse_args(expand_recipe(flags))


def parse_command(argv: list[str]) -> None:
    """Parse with the parsers the command would use; an unknown flag or bad value exits 2."""
    if argv[0] == "finetune":
        from finetune.cli import COMMANDS, make_parser

        options, rest = make_parser().parse_known_args(argv[1:])
        rest = rest[1:] if rest[:1] == ["--"] else rest
        if COMMANDS[options.command].takes_run_flags:
            parse_run_flags(rest)
        else:
            assert not rest, f"unrecognized arguments: {rest}"
    elif argv[:2] == ["accelerate", "launch"]:
        from accelerate.commands.launch import launch_command_parser

        launched = launch_command_parser().parse_args(argv[2:])
        assert launched.training_script == "finetune/run.py"
        parse_run_flags(launched.training_script_args)


BLOCKS = [block for document in DOCUMENTS for block in command_blocks(document)]


def test_the_readme_has_command_blocks_of_every_kind():
    readme = command_blocks(ROOT / "README.md")
    assert {marker for _, marker, _ in readme} >= {"run", "parse", "skip"}


def test_every_docs_page_is_read_for_commands():
    documents = {Path(where.split(":")[0]).name for where, _, _ in BLOCKS}
    assert documents >= {"README.md", "profiles.md", "planner.md"}


@pytest.mark.parametrize(("line", "marker", "block"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_command_block_is_marked(line, marker, block):
    assert marker, f"{line}: mark the block with <!-- readme-test: run|parse|skip -->"


PARSED = [
    (line, argv)
    for line, marker, block in BLOCKS
    if marker in ("run", "parse")
    for argv in commands_of(block)
]


@pytest.mark.parametrize(("line", "argv"), PARSED, ids=[f"{line}-{argv[0]}" for line, argv in PARSED])
def test_readme_command_flags_parse(line, argv):
    parse_command(argv)


@pytest.fixture
def project_copy(tmp_path):
    """The documented layout: the project (its files linked, not copied) with ../shared/data beside it."""
    project = tmp_path / "finetune"
    project.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "outputs"):
            (project / entry.name).symlink_to(entry)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(Path(os.environ["FINETUNE_DATA_DIR"]).resolve())
    return project


RUNS = [(line, block) for line, marker, block in BLOCKS if marker == "run"]


def test_the_readme_has_cpu_commands_to_run():
    assert any("cpu_quickstart" in block for _, block in RUNS)


# The second run of a block trains 2 steps (flags after a recipe override it): what it checks is that a
# re-run replaces the first's results instead of refusing its folder, not the training again.
AGAIN_BRIEFLY = ["--max_steps", "2"]


def again_briefly(block: str) -> str:
    return "\n".join(
        f"{line} {shlex.join(AGAIN_BRIEFLY)}" if line.strip().startswith("finetune run ") else line
        for line in block.splitlines()
    )


@pytest.mark.integration
@pytest.mark.parametrize(("line", "block"), RUNS, ids=[line for line, _ in RUNS])
def test_readme_cpu_commands_run_as_printed_and_again_into_the_same_folder(project_copy, line, block):
    """Each block as printed, then again as a user re-runs it: the second run replaces the first's
    results instead of refusing its folder."""
    environment = {key: value for key, value in ENVIRONMENT.items() if key != "FINETUNE_DATA_DIR"}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    for attempt, script in (("first", block), ("second", again_briefly(block))):
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=project_copy, env=environment,
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip
        assert result.returncode == 0, f"{line}: the {attempt} run failed:\n{result.stderr[-4000:]}"
    summaries = [json.loads(path.read_text()) for path in project_copy.glob("outputs/*/run_summary.json")]
    assert summaries and all(summary["steps"] == 2 for summary in summaries)
