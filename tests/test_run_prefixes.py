"""A run's id prefix, as `hmer runs show` takes it, is taken by every command that names a run
(issue 70); a prefix that several runs begin with is refused in one line that lists them, and the
store is left as it was. (A prefix that one run begins with: tests/test_cli.py's train, evaluate,
predict and report by run id.)"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from mlflow.tracking import MlflowClient
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
SHARED = "feedbeef"  # the first 8 characters of both runs' ids


def _two_runs_with_one_prefix(folder: Path) -> list[str]:
    """A store of two finished runs whose ids both begin with `SHARED` (MLflow makes random ids: the
    two are renamed in its database, in every table that names a run)."""
    from hmer.tracking.store import open_experiment

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = open_experiment(uri, "hmer")[1]
    made = []
    for _ in range(2):
        run = client.create_run(experiment).info.run_id
        client.set_terminated(run)
        made.append(run)
    ids = [SHARED + run[len(SHARED):] for run in made]
    with sqlite3.connect(folder / "mlflow.db") as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            if "run_uuid" in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                for old, new in zip(made, ids):
                    db.execute(f"UPDATE {table} SET run_uuid = ? WHERE run_uuid = ?", (new, old))
    db.close()
    assert sorted(r.info.run_id for r in client.search_runs([experiment])) == sorted(ids)
    return ids


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_prefix_of_two_runs_is_refused_in_one_line_that_lists_them(tmp_path, monkeypatch, capsys):
    from hmer.cli import main

    store = tmp_path / "store"
    store.mkdir()
    ids = _two_runs_with_one_prefix(store)
    image = tmp_path / "x.png"
    Image.new("L", (64, 32), 255).save(image)
    before = _digests(store)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HMER_MLRUNS", str(store))
    monkeypatch.setenv("HMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    for args in (["runs", "show", SHARED], ["predict", SHARED, str(image), "--device", "cpu"],
                 ["evaluate", SHARED, "--data", str(tmp_path / "no-data"), "--device", "cpu"],
                 ["train", "--resume", SHARED], ["report", "--runs", SHARED], ["runs", "rescore", SHARED]):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, (args, err)
        assert f"2 runs in sqlite:///{store / 'mlflow.db'} begin with it" in err, (args, err)
        assert all(run in err for run in ids), (args, err)
    assert _digests(store) == before
