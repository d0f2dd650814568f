"""`hmer runs rescore`: runs trained before a metric was registered (two tiny real runs, trained while the
papers' lgeval metrics are out of the registry) are given its values from the predictions they stored,
under the keys and at the step a new run logs them, equal to what `hmer.evaluation.lgeval` computes on
those predictions; a second pass writes nothing; a run without predictions and a study's own run are
skipped, said why; a bad input (no such run or study, a predictions file that is not one) is one line
and leaves the store as it was, byte for byte."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from metrics_absent import LGEVAL, metrics_absent
from mlflow.tracking import MlflowClient
from study_store import studying_into
from tiny_dataset import tiny_config, tiny_data

from hmer.cli import main
from hmer.evaluation import lgeval
from hmer.evaluation.metrics import Metric
from hmer.registry import METRICS
from hmer.tracking import keys
from hmer.tracking.artifacts import predictions_artifact, read_predictions_csv, scored_key
from hmer.tracking.lock import LOCK_FILE
from hmer.tracking.portable import copy_store, download_run_artifact

REPO = Path(__file__).resolve().parents[1]
STUDY = "rescore-unit"
SPLITS = ("test_2014", "val_final")  # what the tiny runs decode at their end (tiny_data: val and 2014)
ON_GRAPHS = {"lgeval_exprate": 0, "lgeval_le1": 1, "lgeval_le2": 2}  # the graph errors each allows


def test_a_predictions_artifact_names_the_metrics_it_scores():
    for key, artifact in (("test_2014", "predictions/test_2014.csv"),
                          ("test_2014-std", "predictions/test_2014-std.csv"),
                          ("val_final", "split/val_predictions.csv"),
                          ("val-alt_final", "split/val-alt_predictions.csv")):
        assert predictions_artifact(key) == artifact and scored_key(artifact) == key
    for other in ("split/val.txt", "split/_predictions.csv", "model/model.safetensors", "predictions/x/test_1.csv"):
        assert scored_key(other) is None


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A store of two tiny runs of one study trained before the lgeval metrics (one epoch, seeds 1 and 2),
    a run killed before it stored predictions, and the study's parent run: (folder, run ids by role)."""
    from hmer.training import train

    root = tmp_path_factory.mktemp("rescore-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with studying_into(root), metrics_absent():
        ids = {f"seed {seed}": train(tiny_config(**{"train.epochs": 1, "train.seed": seed}), tiny_data(n_test=6),
                                     tracking_uri=uri, experiment=STUDY,
                                     tags={keys.STUDY: STUDY, keys.SEED: str(seed)}).run_id for seed in (1, 2)}
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(STUDY).experiment_id
    for role, tags, status in (("killed", {keys.STATUS: "killed"}, "KILLED"),
                               ("parent", {keys.ROLE: keys.ROLE_STUDY}, "FINISHED")):
        run = client.create_run(experiment, run_name=role, tags={keys.STUDY: STUDY, **tags})
        client.set_terminated(run.info.run_id, status)
        ids[role] = run.info.run_id
    return root, ids


@pytest.fixture
def store(trained, tmp_path):
    """A copy of the trained store for one test: (tracking URI, run ids by role)."""
    root, ids = trained
    db = copy_store(root, tmp_path / "store", portable=False)
    return f"sqlite:///{db}", ids


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _rows(client, run_id: str, key: str, tmp: Path) -> list[dict[str, str]]:
    return read_predictions_csv(download_run_artifact(client, run_id, predictions_artifact(key), str(tmp)))


def test_runs_are_given_the_metrics_registered_after_them_and_a_second_pass_writes_nothing(store, tmp_path, capsys):
    uri, ids = store
    client = MlflowClient(uri)
    trained = [ids["seed 1"], ids["seed 2"]]
    for run_id in trained:
        assert not {f"{key}_{m}" for key in SPLITS for m in LGEVAL} & set(client.get_run(run_id).data.metrics)
    # any registered metric, not the lgeval ones alone: one registered now, after the runs
    METRICS.register("le3", Metric("≤3", lambda d: d <= 3), description="within three token edits (a test's)")
    try:
        assert main(["runs", "rescore", "--tracking-uri", uri]) == 0
        printed = capsys.readouterr().out
        for run_id in trained:
            metrics = client.get_run(run_id).data.metrics
            for key in SPLITS:
                rows = _rows(client, run_id, key, tmp_path / run_id / key)
                predictions, truths = [r["prediction"].split() for r in rows], [r["truth"].split() for r in rows]
                errors = lgeval.errors_per_expression(predictions, truths)
                graphs = errors[~np.isnan(errors)]  # a truth that does not convert leaves the denominator
                step = client.get_metric_history(run_id, f"{key}_exprate")[-1].step
                for name, allowed in ON_GRAPHS.items():
                    assert metrics[f"{key}_{name}"] == pytest.approx(100.0 * np.mean(graphs <= allowed))
                    assert [m.step for m in client.get_metric_history(run_id, f"{key}_{name}")] == [step]
                distances = np.array([float(r["distance"]) for r in rows])
                assert metrics[f"{key}_le3"] == pytest.approx(100.0 * np.mean(distances <= 3))
            assert f"run {run_id[:8]} ({STUDY} " in printed
        assert printed.count("logged 8 metric(s): lgeval_exprate, lgeval_le1, lgeval_le2, le3 of test_2014, "
                             "val_final") == 2
        assert f"no stored predictions (killed): {ids['killed'][:8]}" in printed
        assert f"a study's own run ({keys.ROLE}=study), not a training run: no predictions: {ids['parent'][:8]}" \
            in printed
        lines = printed.splitlines()
        assert f"2 of 4 run(s) rescored in {uri}, 16 metric(s) logged" in lines
        assert lines[-1].startswith(f"the tables on the parent runs of {STUDY} (what the UIs show) predate")

        # the runs' tables show what they now carry (hmer report shows a metric some run has)
        from hmer.reports import format_table, study_table

        assert "2014 ≤2 (lgeval)" in format_table(study_table(STUDY, uri, n_resamples=100))

        folder = Path(uri.removeprefix("sqlite:///")).parent
        before = _files(folder)
        assert main(["runs", "rescore", "--tracking-uri", uri]) == 0
        printed = capsys.readouterr().out
        assert _files(folder) == before  # not a byte written
        assert f"  every registered metric logged already: {ids['seed 1'][:8]} {ids['seed 2'][:8]}" in printed
        assert printed.strip().splitlines()[-1] == f"0 of 4 run(s) rescored in {uri}, 0 metric(s) logged"
    finally:
        METRICS.unregister("le3")


def test_a_dry_run_writes_nothing_and_named_runs_are_the_only_ones_scored(store, capsys):
    uri, ids = store
    folder = Path(uri.removeprefix("sqlite:///")).parent
    before = _files(folder)
    assert main(["runs", "rescore", "--study", STUDY, "--dry-run", "--tracking-uri", uri]) == 0
    printed = capsys.readouterr().out
    assert _files(folder) == before
    assert printed.count("would log 6 metric(s): lgeval_exprate, lgeval_le1, lgeval_le2 of test_2014, val_final") == 2
    assert printed.strip().endswith(f"dry run, nothing written: 2 of 4 run(s) would be rescored in {uri}, 12 metric(s)")

    assert main(["runs", "rescore", ids["seed 2"][:8], "--tracking-uri", uri]) == 0  # a run by its first characters
    printed = capsys.readouterr().out
    client = MlflowClient(uri)
    assert "test_2014_lgeval_le1" in client.get_run(ids["seed 2"]).data.metrics
    assert "test_2014_lgeval_le1" not in client.get_run(ids["seed 1"]).data.metrics
    assert f"1 of 1 run(s) rescored in {uri}, 6 metric(s) logged" in printed.splitlines()


def test_bad_input_is_one_line_and_leaves_the_store_as_it_was(store, tmp_path, capsys):
    uri, ids = store
    folder = Path(uri.removeprefix("sqlite:///")).parent
    client = MlflowClient(uri)
    artifact = Path(client.get_run(ids["seed 2"]).info.artifact_uri.removeprefix("file://")) / "predictions" / \
        "test_2014.csv"
    cases = {"not UTF-8": b"name,truth,prediction,distance\n\xff\xfe,x,x,0\n",
             "no column": b"name,truth\nx,a\n",
             "a row of other cells": b"name,truth,prediction,distance\nx,a,a\n"}
    for what, content in cases.items():
        artifact.write_bytes(content)
        before = _files(folder)
        assert main(["runs", "rescore", "--tracking-uri", uri]) == 2, what
        (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
        assert line.startswith("hmer: error: run ") and ids["seed 2"] in line and "predictions/test_2014.csv" in line
        assert _files(folder) == before, what  # the other run, whose file is good, is not scored either
        assert not (folder / LOCK_FILE).exists()
    for args, says in (((ids["seed 1"][:4],), "give its id, or its first 8 characters"),
                       (("0123456789abcdef",), "no run in"),
                       (("--study", "nosuch"), "study 'nosuch': no run"),
                       (("--tracking-uri", f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}"), "no MLflow store")):
        before = _files(folder)
        argv = ["runs", "rescore", *args] + ([] if "--tracking-uri" in args else ["--tracking-uri", uri])
        assert main(argv) == 2, args
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("hmer: error: ") and says in line, line
        assert _files(folder) == before
    assert not (tmp_path / "none").exists()


def test_a_run_whose_process_is_gone_is_shown_interrupted_and_rescored(store, capsys):
    """Issue 70: a run left RUNNING by a process killed outright was shown as running, and `rescore` told
    to wait for its end, which never comes. Its process gone (on this machine), `runs show` says it is
    interrupted and `rescore` scores what it stored; a run whose process lives is still left to it."""
    uri, ids = store
    client = MlflowClient(uri)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for role, pid in (("seed 1", dead.pid), ("seed 2", os.getpid())):  # killed; alive (this process)
        client.update_run(ids[role], status="RUNNING")
        for key, value in ((keys.STATUS, "running"), (keys.HOST, socket.gethostname()), (keys.PID, str(pid))):
            client.set_tag(ids[role], key, value)
    assert main(["runs", "show", ids["seed 1"][:8], "--tracking-uri", uri]) == 0
    shown = capsys.readouterr().out
    assert "epochs, interrupted (its process (pid " in shown and f"pid {dead.pid} on " in shown, shown
    assert main(["runs", "show", ids["seed 2"][:8], "--tracking-uri", uri]) == 0
    assert "epochs, running" in capsys.readouterr().out
    assert main(["runs", "rescore", ids["seed 1"][:8], ids["seed 2"][:8], "--tracking-uri", uri]) == 0
    printed = capsys.readouterr().out
    assert f"still running: rescore it once it has ended (its final evaluation logs the metrics its own code " \
           f"registers): {ids['seed 2'][:8]}" in printed
    assert f"1 of 2 run(s) rescored in {uri}, 6 metric(s) logged" in printed.splitlines()
    assert "test_2014_lgeval_le1" in client.get_run(ids["seed 1"]).data.metrics


def _many_runs_to_rescore(folder: Path, n: int) -> str:
    """A store of `n` finished runs, each with stored predictions and the ExpRate logged from them, and
    none of the metrics registered since: what `rescore` plans for one after the other."""
    from hmer.tracking.store import open_experiment

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = open_experiment(uri, "many")[1]
    rows = "name,truth,prediction,distance\nx,a + b,a + b,0\ny,\\frac { 1 } { 2 },\\frac { 1 } { 3 },1\n"
    for _ in range(n):
        run = client.create_run(experiment).info.run_id
        client.log_text(run, rows, "predictions/test_2014.csv")
        client.log_metric(run, "test_2014_exprate", 50.0)
        client.log_metric(run, "test_2014_n", 2)
        client.set_terminated(run)
    return uri


def test_sigterm_during_a_rescore_leaves_no_temporary_folder_and_the_store_as_it_was(tmp_path):
    """Issue 70: SIGTERM of `rescore` left its temporary folder of downloaded predictions (21 MB)."""
    folder = tmp_path / "store"
    folder.mkdir()
    uri = _many_runs_to_rescore(folder, 60)
    before = _files(folder)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HMER_MLRUNS")}
    env.update(TMPDIR=str(temporary), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    rescore = subprocess.Popen([sys.executable, "-m", "hmer.cli", "runs", "rescore", "--tracking-uri", uri], env=env,
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(temporary.glob("hmer-rescore-*/*")) and rescore.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)  # until a run's predictions are downloaded: it is planning
    rescore.send_signal(signal.SIGTERM)
    out, err = rescore.communicate(timeout=300)
    assert rescore.returncode == 128 + signal.SIGTERM, (rescore.returncode, out[-2000:], err[-3000:])
    (line,) = err.strip().splitlines()
    assert line == "hmer: stopped by SIGTERM", line
    assert not list(temporary.glob("hmer-rescore-*"))
    assert _files(folder) == before  # planned, not written: no run rescored, no lock left
