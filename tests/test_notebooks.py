"""The report notebooks run top to bottom (nbclient, a real kernel) against the MLflow store a
real smoke study made, through `hmer notebooks`; a cell that raises fails the test. The sweep
notebook runs against the store of a real smoke sweep (finished, pruned and failed trials). Stored
in the project, a notebook is either a source without outputs or was executed by `hmer notebooks`
against the committed store, and says so in its metadata."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import nbformat
import optuna
import pytest
from optuna.trial import TrialState

from hmer.cli import main as hmer_main
from hmer.cli.notebooks import METADATA_KEY, NAMES, run_notebooks
from hmer.studies.sweep_report import NoSweepError, describe_sweep, find_sweep, importance_spread, why_no_importances
from hmer.tracking import keys
from study_store import STUDY_NAME, study_store, studying_into

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return study_store(tmp_path_factory.getbasetemp() / "report-study-store")


def _outputs(nb: nbformat.NotebookNode, mime: str) -> list[str]:
    return [str(o["data"][mime]) for cell in nb.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if mime in o.get("data", {})]


def _streams(nb: nbformat.NotebookNode) -> list[str]:
    return [str(o["text"]) for cell in nb.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if o.get("output_type") == "stream"]


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
    elif name == "sweep":  # given a grid study, the sweep notebook says so and draws nothing
        assert not images
        assert f"{STUDY_NAME} is a grid study, not a sweep" in "\n".join(_streams(nb))
    elif name == "frontier":  # given another study, the frontier notebook says so and has no point
        said = "\n".join(_streams(nb))
        assert f"{STUDY_NAME} is a study of ablate_coverage, not the frontier: no point to draw" in said
        assert "no line has two finished points yet" in said
    else:
        assert len(images) >= 2  # per expression: what each model read, then on the truth


@pytest.mark.slow
def test_training_curves_default_to_every_current_grid_study(store, tmp_path):
    (done,) = run_notebooks(notebooks_dir=NOTEBOOKS, out_dir=tmp_path, tracking_uri=store.tracking_uri,
                            names=("training_curves",), env=_kernel_env(store))
    nb = nbformat.read(done.path, as_version=4)
    assert nb.metadata[METADATA_KEY]["study"] is None
    assert len(_outputs(nb, "image/png")) == 1 and f"### {STUDY_NAME}" in "\n".join(_outputs(nb, "text/markdown"))


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
    assert err == f"hmer: error: unknown notebook exprate_table: choose from {', '.join(NAMES)}"


# ---- the sweep notebook --------------------------------------------------------------------------

SWEEP_NAME = "sweep-notebook"


class PruneOddTrials(optuna.pruners.BasePruner):
    """Prunes every odd-numbered trial at its first report: a sweep with finished and pruned trials
    whatever its tiny models read (they all read about nothing, so the median pruner would decide
    by ties)."""

    def prune(self, study, trial) -> bool:
        return trial.number % 2 == 1


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory):
    """A real smoke sweep (the suite's sweep without the ink-only parameters, tiny images): three
    trials that each measure their CPU cost and train the epochs that fit 1.2 CPU-seconds (several
    epochs, so that every trial reports before its last epoch, where a sweep never prunes), the
    middle one pruned; then a trial that failed in a live worker, as Optuna keeps it."""
    from hmer.studies import run_sweep
    from hmer.studies.budgets import BUDGETS
    from test_studies import IMAGE_SWEEP, TINY
    from tiny_dataset import tiny_data

    root = tmp_path_factory.getbasetemp() / "sweep-store"
    root.mkdir()
    tracking, storage = f"sqlite:///{root / 'mlflow.db'}", f"sqlite:///{root / 'optuna.db'}"
    budget = dataclasses.replace(BUDGETS["smoke"], sweep_trial_cpu_minutes=0.02)
    with studying_into(root):
        outcome = run_sweep(IMAGE_SWEEP, budget, storage=storage, tracking_uri=tracking, data=tiny_data(), n_trials=3,
                            n_jobs=1, study_name=SWEEP_NAME, pruner=PruneOddTrials(),
                            overrides={**TINY, "train.time_budget_s": 0})
    assert outcome.complete
    study = optuna.load_study(study_name=SWEEP_NAME, storage=storage)
    failed = study.ask()
    failed.set_user_attr(keys.ERROR, "RuntimeError: the loss is nan")
    study.tell(failed, state=TrialState.FAIL)
    return {"root": root, "tracking_uri": tracking, "storage": storage}


@pytest.mark.slow
def test_sweep_notebook_shows_a_real_smoke_sweep(sweep_store, tmp_path):
    from mlflow.tracking import MlflowClient

    from hmer.studies.sweep_report import sweep_table
    from hmer.tracking.ui import run_url

    root = sweep_store["root"]
    (done,) = run_notebooks(notebooks_dir=NOTEBOOKS, out_dir=tmp_path, tracking_uri=sweep_store["tracking_uri"],
                            names=("sweep",), env={"HMER_CACHE": str(root / "cache"), "HMER_MLRUNS": str(root),
                                                   "OMP_NUM_THREADS": "1"})
    nb = nbformat.read(done.path, as_version=4)
    study = optuna.load_study(study_name=SWEEP_NAME, storage=sweep_store["storage"])
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.COMPLETE,
                                               TrialState.FAIL]
    text = "\n".join(_streams(nb))
    # the newest sweep of the store's Optuna storage (none named), its table and its failure
    assert describe_sweep(study) in text and "2 complete, 1 pruned, 1 fail" in text
    table = sweep_table(study)
    assert table in text
    pruned_row = next(line.split() for line in table.splitlines() if line.split()[:2] == ["1", "PRUNED"])
    assert pruned_row[2] == "NaN"  # a pruned trial has no objective (Optuna's value is its last report)
    assert "trial 3 failed: RuntimeError: the loss is nan" in text
    # history and pruning reports always; importances and slices where the finished trials differ
    images = _outputs(nb, "image/png")
    reason = why_no_importances(study)
    if reason is None:
        assert len(images) == 4
        assert "resampled 10 %" in "\n".join(_outputs(nb, "text/html"))
    else:  # tiny models mostly read 0 %
        assert len(images) == 2 and reason in text and "no importances: no slices" in text
    # the best trial: its run, link, validation, measured cost and config as trained
    best = study.best_trial
    run = MlflowClient(sweep_store["tracking_uri"]).get_run(best.user_attrs[keys.TRIAL_RUN_ID])
    html = "\n".join(_outputs(nb, "text/html"))
    assert f"trial {best.number}" in html and run.info.run_id in html
    assert str(round(best.user_attrs[keys.TRIAL_CPU_SECONDS_PER_IMAGE] * 1000, 2)) in html
    assert f"<td>{round(run.data.metrics['val_final_exprate'], 2)}</td>" in html
    assert "<th>train.epochs</th>" in html and f"<td>{run.data.params['train.lr']}</td>" in html
    link = run_url(run.info.experiment_id, run.info.run_id)
    assert link in "\n".join(_outputs(nb, "text/markdown"))


def test_find_sweep_says_what_the_store_holds(tmp_path):
    empty = tmp_path / "empty"
    with pytest.raises(NoSweepError, match=r"^no sweep in this store yet: it has no Optuna storage"):
        find_sweep(f"sqlite:///{empty / 'mlflow.db'}")
    assert not empty.exists()  # reading makes no store
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    grid = optuna.create_study(study_name="a-grid", storage=storage)
    grid.set_user_attr(keys.KIND, "grid")
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the storage beside it is found
    with pytest.raises(NoSweepError, match=r"^no sweep in this store yet: its Optuna storage holds a-grid \(grid\)"):
        find_sweep(tracking)
    with pytest.raises(NoSweepError, match=r"^a-grid is a grid study, not a sweep"):
        find_sweep(tracking, study="a-grid")
    with pytest.raises(NoSweepError, match=r"^no study nope in this store's Optuna storage; it holds a-grid"):
        find_sweep(tracking, study="nope")
    for name in ("old-sweep", "new-sweep"):
        sweep = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        sweep.set_user_attr(keys.KIND, "sweep")
        sweep.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    assert find_sweep(tracking).study_name == "new-sweep"
    assert find_sweep(None, storage=storage, study="old-sweep").study_name == "old-sweep"


def test_importances_rank_the_parameter_that_decides_the_objective(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1) + trial.suggest_float("y", 0, 1) / 20
                   + 0 * trial.suggest_categorical("z", [1, 2, 3]), n_trials=20)
    spread = importance_spread(study)
    assert list(spread.index) == ["x", "y", "z"]
    assert spread.loc["x", "importance"] > 0.8 and abs(spread["importance"].sum() - 1) < 1e-9
    assert spread.loc["x", "resampled 10 %"] > spread.loc["y", "resampled 90 %"]
    assert spread["resamples"].eq(20).all()

    flat = optuna.create_study(direction="maximize")
    flat.optimize(lambda trial: 0 * trial.suggest_float("x", 0, 1), n_trials=3)
    assert why_no_importances(flat).startswith("every finished trial of")
    with pytest.raises(ValueError, match="scored the same objective"):
        importance_spread(flat)
    one = optuna.create_study(direction="maximize")
    one.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    assert "need two finished trials" in why_no_importances(one)
