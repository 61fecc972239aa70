"""Measured training peaks beside the planner's predictions, for every calibrate.sh folder under DIR
(DIR itself or its subfolders), without writing anything: the table docs/planner.md shows.

usage: python benchmarks/scripts/peaks_table.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from calibration_rows import measured_rows, print_table


def main(folder: Path) -> None:
    folders = [folder, *sorted(path for path in folder.iterdir() if path.is_dir())]
    print_table([row for each in folders for row in measured_rows(each)])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
