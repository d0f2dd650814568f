"""The report notebooks run top to bottom (nbclient, a real kernel) against the MLflow store a
real smoke study made, through `hmer notebooks`; a cell that raises fails the test. Stored in the
project, a notebook is either a source without outputs or was executed by `hmer notebooks`
against the committed store, and says so in its metadata."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

from hmer.cli import main as hmer_main
from hmer.reports.notebooks import METADATA_KEY, NAMES, run_notebooks
from study_store import STUDY_NAME, study_store

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return study_store(tmp_path_factory.getbasetemp() / "report-study-store")


def _outputs(nb: nbformat.NotebookNode, mime: str) -> list[str]:
    return [str(o["data"][mime]) for cell in nb.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if mime in o.get("data", {})]


def _kernel_env(store) -> dict[str, str]:
    """The study's private data cache and MLflow home, one thread."""
    return {"HMER_CACHE": str(store.cache), "HMER_MLRUNS": str(store.root), "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("name", NAMES)
def test_stored_notebook_is_a_source_or_shows_the_committed_store(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    if not any(cell.outputs for cell in code):
        assert all(cell.execution_count is None for cell in code), f"{name}: clear with hmer notebooks --clear"
        assert METADATA_KEY not in nb.metadata, f"{name}: a run record without outputs"
        return
    record = nb.metadata.get(METADATA_KEY)
    assert record, f"{name}: outputs not made by `hmer notebooks` (no metadata.{METADATA_KEY})"
    # The committed store, named as a fresh clone names it (no private temporary store).
    assert record["tracking_uri"].startswith("mlruns/mlflow.db") or record["tracking_uri"] == "sqlite:///mlruns/mlflow.db"
    assert record["git_commit"] and not record["git_commit"].endswith("-dirty"), record
    text = json.dumps([cell.outputs for cell in code])
    assert "/tmp/" not in text and str(REPO) not in text and "Traceback" not in text  # no local path, no error
    assert not [o for cell in code for o in cell.outputs if o.get("output_type") == "error"]
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), f"{name}: cells run out of order or some not run: {counts}"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_against_a_smoke_study(name, store, tmp_path):
    (done,) = run_notebooks(notebooks_dir=NOTEBOOKS, out_dir=tmp_path, tracking_uri=store.tracking_uri,
                            study=store.study, names=(name,), env=_kernel_env(store))  # raises if a cell raises
    assert done.path == tmp_path / f"{name}.ipynb"
    umask = os.umask(0)
    os.umask(umask)
    assert done.path.stat().st_mode & 0o777 == 0o666 & ~umask  # as any file the user saves, not private
    nb = nbformat.read(done.path, as_version=4)
    assert "IProgress" not in str([c.outputs for c in nb.cells if c.cell_type == "code"])  # no widget warning
    assert nb.metadata[METADATA_KEY]["study"] == store.study
    assert nb.metadata[METADATA_KEY]["tracking_uri"] == store.tracking_uri
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


@pytest.mark.slow
def test_hmer_notebooks_writes_in_place_and_clears(store, tmp_path, capsys, monkeypatch):
    """The command as a user runs it: executed in place, then cleared back to the source."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    source = (NOTEBOOKS / "training_curves.ipynb").read_text()
    (folder / "training_curves.ipynb").write_text(source)
    for key, value in _kernel_env(store).items():
        monkeypatch.setenv(key, value)
    assert hmer_main(["notebooks", "training_curves", "--notebooks", str(folder), "--tracking-uri",
                      store.tracking_uri, "--study", store.study]) == 0
    assert "training_curves.ipynb: executed in" in capsys.readouterr().out
    nb = nbformat.read(folder / "training_curves.ipynb", as_version=4)
    assert _outputs(nb, "image/png") and nb.metadata[METADATA_KEY]["study"] == store.study
    assert hmer_main(["notebooks", "--clear", "training_curves", "--notebooks", str(folder)]) == 0
    cleared = nbformat.read(folder / "training_curves.ipynb", as_version=4)
    assert METADATA_KEY not in cleared.metadata
    assert not any(c.outputs for c in cleared.cells if c.cell_type == "code")


@pytest.mark.slow
def test_a_cell_that_raises_leaves_the_notebook_as_it_was(tmp_path, capsys):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('first')"),
                                         nbformat.v4.new_code_cell("raise RuntimeError('a broken cell')")])
    path = folder / "training_curves.ipynb"
    nbformat.write(nb, path)
    before = path.read_bytes()
    with pytest.raises(Exception, match="a broken cell"):
        run_notebooks(notebooks_dir=folder, names=("training_curves",))
    assert path.read_bytes() == before
    assert [p.name for p in folder.iterdir()] == ["training_curves.ipynb"]  # no temporary file left


def test_hmer_notebooks_rejects_an_unknown_name_in_one_line(capsys):
    assert hmer_main(["notebooks", "exprate_table"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hmer: error: unknown notebook exprate_table: choose from exprate_tables, training_curves, attention_maps"
