"""The report notebooks run top to bottom (nbclient, a real kernel) against the MLflow store a
real smoke study made; a cell that raises fails the test. They are stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from study_store import STUDY_NAME, study_store

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ("exprate_tables", "training_curves", "attention_maps")
CELL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return study_store(tmp_path_factory.getbasetemp() / "report-study-store")


def _outputs(nb: nbformat.NotebookNode, mime: str) -> list[str]:
    return [str(o["data"][mime]) for cell in nb.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if mime in o.get("data", {})]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{name}: clear the outputs before committing"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_against_a_smoke_study(name, store, monkeypatch):
    from nbclient import NotebookClient

    # The kernel inherits these: the study's store, the study, the private data cache, one thread.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.tracking_uri)
    monkeypatch.setenv("HMER_STUDY", store.study)
    monkeypatch.setenv("HMER_CACHE", str(store.cache))
    monkeypatch.setenv("HMER_MLRUNS", str(store.root))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()  # raises if a cell raises
    images = _outputs(nb, "image/png")
    if name == "exprate_tables":
        tables = "\n".join(_outputs(nb, "text/markdown"))
        assert f"**{STUDY_NAME}**" in tables and "| variant | seeds | 2014 ExpRate" in tables
        assert "2016 ≤1" in tables and "2019 Δ ExpRate" in tables and "none (baseline)" in tables
        assert "by target length and structure" in tables and "Published ExpRate" in tables
        assert len(images) == 2  # the one study's scores, and where its variants fail
    elif name == "training_curves":
        assert len(images) == 1
        assert "val_exprate" in "\n".join(_outputs(nb, "text/html"))
    else:
        assert len(images) >= 2  # per expression: what each model read, then on the truth
