"""The notebooks run top to bottom on CPU from the data in the repository, so they never rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("name", ["explore_runs.ipynb", "memory_planner.ipynb"])
def test_notebook_runs_top_to_bottom(name):
    """nbclient raises CellExecutionError, with the cell and its traceback, if any cell fails."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3")
    client.execute(cwd=str(NOTEBOOKS))
    assert all(cell.get("execution_count") for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.parametrize("name", ["explore_runs.ipynb", "memory_planner.ipynb"])
def test_notebook_is_stored_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")
