"""Tables in the README that are generated from data in the repository stay equal to their source."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "sitting",
    ["h200-2026-11-23b", "h200-2026-11-24", "h200x2-2026-11-24", "h200-2026-11-24d", "h200-2026-11-24e"],
)
def test_speed_table_is_the_one_generated_from_the_stored_results(sitting):
    script = ROOT / "tests" / "gpu" / "speed_table.py"
    results = ROOT / "tests" / "gpu" / "results" / sitting
    table = subprocess.run(
        [sys.executable, str(script), str(results)], capture_output=True, text=True, check=True
    )
    assert table.stdout.strip() in (ROOT / "README.md").read_text(), "stale: rerun tests/gpu/speed_table.py"
