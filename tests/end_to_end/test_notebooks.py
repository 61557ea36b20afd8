"""The notebooks run top to bottom on CPU: theory.ipynb as shipped, quickstart.ipynb on the smoke experiment
(its parameters cell replaced), and both ship without outputs."""

from __future__ import annotations

import ast

import nbformat
import pytest
from conftest import REPO

nbclient = pytest.importorskip("nbclient")
NOTEBOOKS = REPO / "notebooks"


def execute(name, cwd, parameters=None):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    if parameters is not None:
        cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
        cell.source = "\n".join(f"{key} = {value!r}" for key, value in parameters.items())
    nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    ).execute()
    return notebook


def text_output(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.mark.parametrize("name", ["quickstart.ipynb", "theory.ipynb"])
def test_notebooks_are_committed_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.slow
def test_theory_notebook_runs(tmp_path):
    notebook = execute("theory.ipynb", tmp_path)
    assert (tmp_path / "results" / "figures" / "figure1_kl3_bounds.png").exists()
    printed = "".join(text_output(c) for c in notebook.cells if c.cell_type == "code")
    assert "δ = 0.07 ⇔ w ∈ [0.671, 1.422]" in printed and printed.rstrip().endswith("ok")


@pytest.mark.slow
def test_quickstart_notebook_runs_the_smoke_experiment(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    notebook = execute("quickstart.ipynb", REPO, {"EXPERIMENT": "smoke", "RUN_DIR": str(run_dir), "OVERRIDES": []})
    summary = ast.literal_eval(text_output(notebook.cells[-1]).strip().splitlines()[-1])
    assert summary["steps"] == 4
    for side in ("before", "after"):
        assert 0.0 <= summary[side]["mean@4"] <= summary[side]["pass@4"] <= 100.0
    assert (run_dir / "DONE").exists()
