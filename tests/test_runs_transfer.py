"""`hmer runs export` / `hmer runs import`: runs of one real MLflow store merged into another with
their params, metric histories, tags, artifacts and parent links, idempotently, and still usable by
`hmer evaluate`, `hmer predict` and `hmer report` under their original ids."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from hmer.cli import main
from hmer.tracking import keys
from hmer.tracking.transfer import export_runs, import_runs
from hmer.training import train
from tiny_dataset import tiny_config, write_dataset


@pytest.fixture
def stores(tmp_path, monkeypatch):
    monkeypatch.setenv("HMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "home-a"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    a = f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}"
    b = f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return a, b


def _history(client, run_id, key):
    return sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))


def _all(client):
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, max_results=1000)


def test_export_import_round_trip_keeps_everything_and_is_idempotent(stores, tmp_path, capsys):
    a, b = stores
    data = write_dataset(tmp_path / "data")
    cfg = tiny_config(**{"train.epochs": 2, "data.path": str(data), "data.test_years": "2014"})
    client_a = MlflowClient(a)
    # A study-like parent with the trained run as its child, as `hmer.studies` records them.
    exp = client_a.create_experiment("unit", artifact_location=(tmp_path / "a" / "artifacts").as_uri())
    parent = client_a.create_run(exp, run_name="study", tags={"hmer.role": "study"}).info.run_id
    trained = train(cfg, tracking_uri=a, experiment="unit", parent_run_id=parent, run_name="child").run_id
    client_a.set_terminated(parent)

    export = tmp_path / "out" / "runs.tar.gz"
    # Parts of 64 KiB: the model artifact alone is larger, so the file must come back in pieces.
    result = export_runs(export, tracking_uri=a, part_mb=1 / 16)
    assert result.runs == 2 and len(result.files) > 1 and not export.exists()
    assert all(f.stat().st_size <= 2**16 for f in result.files)

    assert main(["runs", "import", str(result.files[1]), "--tracking-uri", b]) == 0  # any part finds all
    client_b = MlflowClient(b)
    runs = {r.data.tags[keys.SOURCE_RUN_ID]: r for r in _all(client_b)}
    assert set(runs) == {parent, trained}
    child, new_parent = runs[trained], runs[parent]
    src = client_a.get_run(trained)
    assert child.info.run_id != trained  # MLflow gives created runs new ids ...
    assert child.data.tags[keys.MLFLOW_PARENT_RUN_ID] == new_parent.info.run_id  # ... and the link follows them
    assert child.data.params == src.data.params
    assert child.data.tags["hmer.device"] == src.data.tags["hmer.device"]
    assert child.info.run_name == "child" and child.info.status == "FINISHED"
    assert child.info.start_time == src.info.start_time and child.info.end_time == src.info.end_time
    for key in src.data.metrics:
        assert _history(client_b, child.info.run_id, key) == _history(client_a, trained, key), key
    assert len(_history(client_b, child.info.run_id, "train_loss")) == 2
    paths = {f.path for f in client_b.list_artifacts(child.info.run_id, "model")}
    assert "model/model.safetensors" in paths
    assert {f.path for f in client_b.list_artifacts(child.info.run_id, "predictions")} == {
        "predictions/test_2014.csv"}

    # Importing the same file again duplicates nothing; a later export adds only what is new.
    client_a.log_batch(trained, metrics=[Metric("late_metric", 1.5, 123, 7)])
    assert import_runs(export, tracking_uri=b).created == []
    again = import_runs(export_runs(tmp_path / "later.tar.gz", tracking_uri=a).files[0], tracking_uri=b)
    assert again.created == [] and sorted(again.updated) == sorted(r.info.run_id for r in runs.values())
    assert len(_all(client_b)) == 2
    assert _history(client_b, child.info.run_id, "late_metric") == [(7, 123, 1.5)]
    assert len(_history(client_b, child.info.run_id, "train_loss")) == 2

    # Re-exporting the imported runs keeps their original ids as the source ids.
    onward = export_runs(tmp_path / "onward.tar.gz", tracking_uri=b).files[0]
    c = f"sqlite:///{tmp_path / 'c.db'}"
    assert set(import_runs(onward, tracking_uri=c).id_map) == {parent, trained}

    # The original id still works for evaluate and predict, and the report shows the device.
    capsys.readouterr()
    assert main(["evaluate", trained, "--tracking-uri", b, "--data", str(data), "--years", "2014",
                 "--beam", "2", "--device", "cpu"]) == 0
    assert "2014" in capsys.readouterr().out
    image = data / "2014" / "2014_0.png"
    assert main(["predict", trained, str(image), "--tracking-uri", b, "--beam", "2", "--device", "cpu"]) == 0
    assert main(["report", "--experiment", "unit", "--tracking-uri", b, "--out", str(tmp_path / "rep")]) == 0
    with (tmp_path / "rep" / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["device"] for r in rows] == [src.data.tags["hmer.device"]]


def test_missing_parts_and_unknown_experiments_are_errors(stores, tmp_path, capsys):
    a, _ = stores
    MlflowClient(a).create_experiment("only")
    assert main(["runs", "export", str(tmp_path / "x.tar.gz"), "--experiment", "nope", "--tracking-uri", a]) == 2
    assert "nope" in capsys.readouterr().err
    Path(tmp_path / "y.tar.gz.part-001").write_bytes(b"x")
    assert main(["runs", "import", str(tmp_path / "y.tar.gz"), "--tracking-uri", a]) == 2
    assert "missing" in capsys.readouterr().err


def test_a_store_with_no_runs_exports_an_empty_file_that_imports_as_nothing(stores, tmp_path):
    # A GPU lease whose steps all failed still brings its (empty) store home.
    a, b = stores
    res = export_runs(tmp_path / "empty.tar.gz", tracking_uri=a)
    assert res.runs == 0 and res.files == [tmp_path / "empty.tar.gz"]
    assert not list(tmp_path.glob("empty.tar.gz.tmp"))
    imported = import_runs(tmp_path / "empty.tar.gz", tracking_uri=b)
    assert not imported.created and not imported.updated and not _all(MlflowClient(b))
