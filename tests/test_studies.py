"""Optuna studies end to end: real training of a tiny model, a real SQLite Optuna storage and a
real MLflow store in a temporary folder; resume after `kill -9`; two workers on one study."""

from __future__ import annotations

import collections
import json
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from optuna.exceptions import StorageInternalError
from optuna.trial import TrialState
from sqlalchemy.exc import OperationalError

from hmer.cli.study import present
from hmer.studies import STUDIES, StudySpec, ablations, get_budget, run_grid_study, run_sweep
from hmer.studies.sweep_report import sweep_table
from hmer.tracking import keys
from hmer.checkpoint import load_checkpoint
from tiny_dataset import tiny_data, write_dataset

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "studies" / "ablate_direction.py"
DIRECTION, SWEEP = STUDIES.get("ablate_direction"), STUDIES.get("sweep")

# Held equal in every cell: a one-epoch tiny model, short decoding, one test year.
TINY = {"train.epochs": 1, "train.beam_size": 2, "train.max_decode_len": 12, "train.attention_maps": 0,
        "train.device": "cpu", "data.batch_pixels": 20_000, "data.max_batch_size": 8, "data.test_years": "2014"}

pytestmark = pytest.mark.slow


@pytest.fixture
def stores(tmp_path, monkeypatch):
    """A private MLflow home (SQLite store + artifacts) and Optuna SQLite storage under tmp_path."""
    torch.set_num_threads(1)
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "mlruns"))
    monkeypatch.setenv("HMER_CACHE", str(tmp_path / "cache"))  # rendered-data cache of the tiny dataset
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    return (f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}")


def _cells(study: optuna.Study, state: TrialState) -> collections.Counter:
    return collections.Counter(t.user_attrs[keys.CELL_KEY] for t in study.get_trials(states=(state,)))


def _child_runs(tracking: str, experiment: str):
    """(parent runs, trials' runs) of the study's MLflow experiment; the variants' summary runs
    (`hmer.role=summary`, children of the parent too) are neither."""
    client = MlflowClient(tracking)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return [], []
    all_runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in all_runs if r.data.tags.get("hmer.role") == "study"]
    children = [r for r in all_runs if "hmer.role" not in r.data.tags]
    return parents, children


def test_grid_study_end_to_end_and_rerun_runs_nothing(stores, capsys):
    tracking, storage = stores
    outcome = run_grid_study(DIRECTION, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(),
                             seeds=(1,), overrides=TINY, study_name="direction-test")
    assert outcome.complete and outcome.n_complete == outcome.n_expected == 3
    present(outcome)  # as the command that ran it does, once it has ended (hmer study, the scripts)

    study = optuna.load_study(study_name="direction-test", storage=storage)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(study.trials) == 3 and len(complete) == 3
    assert sorted(t.params["model.direction"] for t in complete) == ["bi", "l2r", "r2l"]
    assert all(t.params["train.seed"] == 1 for t in complete)

    parents, children = _child_runs(tracking, "direction-test")
    assert len(parents) == 1 and len(children) == 3
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.info.run_id == outcome.parent_run_id
    assert {"study", "budget", "grid", "storage"} <= set(parent.data.params)
    assert parent.data.params["budget"] == "smoke" and "model.direction" in parent.data.params["grid"]
    by_trial = {t.number: t for t in complete}
    for run in children:
        tags = run.data.tags
        assert run.info.status == "FINISHED" and tags["hmer.status"] == "finished"
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        trial = by_trial[int(tags["hmer.trial"])]
        assert tags["hmer.cell"] == f"model.direction={trial.params['model.direction']}"
        assert tags["hmer.variant"] == trial.params["model.direction"] and tags["hmer.seed"] == "1"
        assert trial.user_attrs[keys.TRIAL_RUN_ID] == run.info.run_id
        assert run.data.params["model.direction"] == trial.params["model.direction"]
        assert trial.user_attrs["hmer.test_2014_n"] == 4 and "hmer.test_2014_exprate" in trial.user_attrs
    # Every other setting is held equal: the children's params differ only in the grid axis.
    params = [{k: v for k, v in r.data.params.items() if k not in ("model.direction",)} for r in children]
    assert all(p == params[0] for p in params)
    out = capsys.readouterr().out
    assert "budget smoke" in out and "expected cost" in out
    assert "l2r" in out and "r2l" in out and "bi" in out  # the table
    # what the study cost, as its own trials measured it (their runs' metrics)
    cpu = [r.data.metrics["cpu_seconds"] for r in children]
    assert all(c > 0 for c in cpu)
    assert ("study direction-test: cost measured on its 3 finished trial(s):" in out
            and f"{sum(cpu) / len(cpu) / 60:.0f} CPU-min a trial" in out), out

    # What the MLflow UI shows (tests/test_ui.py looks at it in a browser): a model-training
    # experiment, readable child runs, the figure and table on the parent run, a summary run per
    # variant with its mean ExpRate per year, every run of a variant in its colour, the link
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("direction-test")
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"
    assert sorted(r.info.run_name for r in children) == ["bi seed 1", "l2r seed 1", "r2l seed 1"]
    parent = client.get_run(parent.info.run_id)
    assert keys.VARIANT not in parent.data.tags  # grouped by variant, the parent joins no group
    note = parent.data.tags.get("mlflow.note.content", "")
    assert "| l2r (baseline) | 1 |" in note and "| bi | 1 |" in note and "2014 ExpRate" in note
    folder = Path(parent.info.artifact_uri.removeprefix("file://"))
    table_md, figure = folder / "table.md", folder / "exprate.png"
    assert table_md.read_text() in note
    assert figure.read_bytes().startswith(b"\x89PNG")
    assert f"get-artifact?path=exprate.png&run_uuid={parent.info.run_id}" in note
    assert not [k for k in parent.data.metrics if "/" in k]  # no one-bar chart per variant
    summaries = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get(keys.ROLE) == "summary"]
    assert sorted(r.info.run_name for r in summaries) == ["bi: mean of 1 seed", "l2r: mean of 1 seed",
                                                          "r2l: mean of 1 seed"]
    by_variant = {r.data.tags[keys.VARIANT]: r for r in children}
    for summary in summaries:
        variant = summary.data.tags[keys.VARIANT]
        assert summary.data.tags["mlflow.parentRunId"] == parent.info.run_id and summary.info.status == "FINISHED"
        trial_run = by_variant[variant]
        assert summary.data.metrics["2014 ExpRate"] == pytest.approx(trial_run.data.metrics["test_2014_exprate"])
        assert summary.data.tags["mlflow.runColor"] == trial_run.data.tags["mlflow.runColor"]
    assert len({r.data.tags["mlflow.runColor"] for r in summaries}) == 3
    assert (f"#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning&compareRunsMode=CHART"
            f"&orderByKey=metrics.%602014%20ExpRate%60&orderByAsc=false") in out
    # optuna-dashboard: the objective by name, the study's description, its note
    assert study.metric_names == ["best validation ExpRate (%)"]
    assert study.user_attrs[keys.DESCRIPTION] == DIRECTION.description
    from optuna_dashboard import get_note

    assert get_note(study).startswith(f"**direction-test**: {DIRECTION.description}")

    # Running the finished study again prints its table and writes nothing: not a byte of either
    # database, nor the parent run's artifacts (a fresh clone's main job leaves `git status` clean)
    home = Path(tracking[len("sqlite:///"):]).parent
    before = {f: f.read_bytes() for f in (home / "mlflow.db", home / "optuna.db", table_md, figure)}
    again = run_grid_study(DIRECTION, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(),
                           seeds=(1,), overrides=TINY, study_name="direction-test")
    present(again)
    assert again.complete and len(optuna.load_study(study_name="direction-test", storage=storage).trials) == 3
    assert again.parent_run_id == outcome.parent_run_id
    out = capsys.readouterr().out
    assert "l2r (baseline)" in out and "  cost measured on its 3 finished trial(s)" in out  # in the banner too
    changed = [f.name for f, content in before.items() if f.read_bytes() != content]
    assert not changed, f"running a finished study again rewrote {changed}"


def test_a_cell_that_fails_is_marked_failed_and_retried_by_the_next_run(stores):
    tracking, storage = stores
    # A learning rate of 1e30 makes the loss NaN: train() raises in the first epoch.
    spec = StudySpec(name="lr", description="a cell that diverges", axes={"train.lr": (1.0, 1e30)},
                     model_presets={"tiny": "tiny-transformer"})
    outcome = run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), seeds=(1,),
                             overrides=TINY, study_name="lr-test")
    assert not outcome.complete and outcome.n_complete == 1
    assert outcome.failed == ["train.lr=1e+30, train.seed=1"]
    study = optuna.load_study(study_name="lr-test", storage=storage)
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert len(study.trials) == 2 and len(failed) == 1  # not retried in the same run
    assert "FloatingPointError" in failed[0].user_attrs[keys.ERROR]

    parents, children = _child_runs(tracking, "lr-test")
    assert parents[0].info.status == "FAILED" and parents[0].data.tags["hmer.status"] == "incomplete"
    run = next(r for r in children if r.data.tags["hmer.trial"] == str(failed[0].number))
    assert run.info.status == "FAILED" and run.data.tags["hmer.status"] == "failed"

    again = run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), seeds=(1,),
                           overrides=TINY, study_name="lr-test")
    assert not again.complete and again.parent_run_id == outcome.parent_run_id
    assert len(optuna.load_study(study_name="lr-test", storage=storage).get_trials(states=(TrialState.FAIL,))) == 2


def test_a_resumed_study_trains_its_stored_config_and_refuses_other_values_it_is_asked_for(stores):
    """One rule decides a resume: the stored base config wins over today's defaults (here a value
    the code no longer gives by default), and a command that asks for another value of a key it
    sets (--set), or for another budget, is refused before it runs anything."""
    tracking, storage = stores
    # One cell that fails in its first step (NaN loss): quick, and it runs again on every resume.
    spec = StudySpec(name="kept", description="a study whose defaults changed", axes={"train.lr": (1e30,)},
                     model_presets={"tiny": "tiny-transformer"})

    def run(budget="smoke", **more):
        return run_grid_study(spec, budget, storage=storage, tracking_uri=tracking, data=tiny_data(), seeds=(1,),
                              overrides={**TINY, **more}, study_name="kept-test")

    run()
    rdb = optuna.storages.RDBStorage(storage)
    study_id = rdb.get_study_id_from_name("kept-test")
    base = dict(rdb.get_study_system_attrs(study_id)["hmer.config"])
    began_with = not base["train.channels_last"]  # as if the code's default had changed since it began
    base["train.channels_last"] = began_with
    rdb.set_study_system_attr(study_id, "hmer.config", base)

    assert run().failed == ["train.lr=1e+30, train.seed=1"]  # resumed, not refused
    _, children = _child_runs(tracking, "kept-test")
    latest = max(children, key=lambda r: r.info.start_time)
    assert latest.data.params["train.channels_last"] == str(began_with)  # the stored value, not today's default

    with pytest.raises(ValueError, match=r"train\.beam_size: study 2, now 3\).*use the same options"):
        run(**{"train.beam_size": 3})
    with pytest.raises(ValueError, match=rf"train\.channels_last: study {began_with}, now {not began_with}"):
        run(**{"train.channels_last": not began_with})
    with pytest.raises(ValueError, match="exists with budget 'smoke', but this command asks for 'smoke-2'"):
        run(dataclasses.replace(get_budget("smoke"), name="smoke-2"))
    assert len(optuna.load_study(study_name="kept-test", storage=storage).trials) == 2  # the refused ran nothing


def test_a_different_grid_under_the_same_name_is_refused(stores):
    tracking, storage = stores
    store = optuna.storages.RDBStorage(storage)
    study = optuna.create_study(study_name="taken", storage=store)
    study.set_user_attr("hmer.kind", "grid")
    study.set_user_attr("hmer.grid", {"model.direction": ["l2r"], "train.seed": [1]})
    store.set_study_system_attr(store.get_study_id_from_name("taken"), "hmer.config", {})
    with pytest.raises(ValueError, match="use the same options"):
        run_grid_study(DIRECTION, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), seeds=(1,),
                       overrides=TINY, study_name="taken")


def _command(tmp_path: Path, tracking: str, storage: str, seeds: str, epochs: int = 1, **more) -> list[str]:
    sets = [f"{k}={v}" for k, v in {**TINY, "train.epochs": epochs, **more}.items()]
    return [sys.executable, str(SCRIPT), "--budget", "smoke", "--seeds", seeds, "--data", str(tmp_path / "data"),
            "--tracking-uri", tracking, "--storage", storage, "--study-name", "direction-cli", "--set", *sets]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(OMP_NUM_THREADS="1", HMER_MLRUNS=str(tmp_path / "mlruns"), HMER_CACHE=str(tmp_path / "cache"),
               PYTHONUNBUFFERED="1")
    return env


def _wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str) -> None:
    """Poll `predicate` until it holds, with `proc` stopped (SIGSTOP) while it is read: what it reads
    (the Optuna trials, the MLflow runs, the checkpoint) is then one moment of the process, and the
    process is still in that moment when this returns, stopped, for the caller to kill. Polling a
    running process left a window: a loaded machine finished the trial between the read and the kill."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the study ended (status {proc.returncode}) before {what}")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            if predicate():
                return
        except (OperationalError, StorageInternalError, MlflowException):
            pass  # stopped inside a write to a SQLite store (Optuna wraps SQLAlchemy's error): not now
        os.kill(proc.pid, signal.SIGCONT)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _kill_after_two_checkpointed_epochs(cmd, env, tmp_path, study_name: str, storage: str, tracking: str,
                                        what: str, cwd: Path = REPO) -> dict:
    """Run a study, and kill it with SIGKILL in the middle of a trial's training: once its first
    RUNNING trial's MLflow run is RUNNING and has left a checkpoint of two epochs or more, and fewer
    than the trial trains (beside its SQLite MLflow store `tracking`). Returns that trial, its run id
    and the checkpoint's epoch."""
    checkpoints = Path(tracking[len("sqlite:///"):]).parent / "checkpoints"
    killed: dict = {}

    def two_epochs_checkpointed() -> bool:
        try:
            study = optuna.load_study(study_name=study_name, storage=storage)
        except KeyError:
            return False
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running:  # (and MLflow's store may still be being created: not touched before)
            return False
        _, children = _child_runs(tracking, study_name)
        runs = [r for r in children if r.data.tags.get("hmer.trial") == str(running[0].number)
                and r.info.status == "RUNNING"]
        if not runs:  # the trial is booked before its MLflow run starts, and told after it ends
            return False
        # The checkpoint's own epoch, not the logged metrics: an epoch's metrics are logged just
        # before its checkpoint is written.
        try:
            checkpoint = load_checkpoint(checkpoints / runs[0].info.run_id / "last.pt")
        except (FileNotFoundError, ValueError):  # none yet, or the finished trial has just removed it
            return False
        epoch = int(checkpoint["epoch"])
        if not 2 <= epoch < int(checkpoint["config"]["train"]["epochs"]):  # trained, decoding its test years
            return False
        killed.update(number=running[0].number, run_id=runs[0].info.run_id, epoch=epoch)
        return True

    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            _wait_for(two_epochs_checkpointed, proc, 240, what)
        finally:
            proc.kill()  # (stopped or not)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # the trial as the killed process left it (all its attributes written)
    killed["trial"] = optuna.load_study(study_name=study_name, storage=storage).trials[killed.pop("number")]
    return killed


def test_a_study_killed_mid_trial_resumes_without_losing_or_repeating_a_cell(stores, tmp_path):
    tracking, storage = stores
    write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    # Ten epochs make a trial last long enough to be killed in the middle of its training.
    cmd, env = _command(tmp_path, tracking, storage, "1", epochs=10), _env(tmp_path)
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    def one_complete_one_training() -> bool:
        """A trial is COMPLETE and the next one is RUNNING with its MLflow run started."""
        try:
            study = optuna.load_study(study_name="direction-cli", storage=storage)
        except KeyError:
            return False
        trials = study.get_trials(deepcopy=False)
        running = [t.number for t in trials if t.state == TrialState.RUNNING]
        if not running or not any(t.state == TrialState.COMPLETE for t in trials):
            return False
        _, children = _child_runs(tracking, "direction-cli")
        return any(r.data.tags.get("hmer.trial") == str(running[0]) for r in children)

    try:
        _wait_for(one_complete_one_training, proc, 240, "a trial completed and the next one started training")
    finally:
        proc.kill()  # (stopped or not)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed = optuna.load_study(study_name="direction-cli", storage=storage).get_trials(states=(TrialState.RUNNING,))
    assert len(killed) == 1
    # No checkpoint of the killed trial survives here (as on a machine that is gone), so its cell
    # trains again from scratch in a new run; test_a_killed_trial_continues_from_its_checkpoint
    # is the case where it survives.
    shutil.rmtree(tmp_path / "mlruns" / "checkpoints", ignore_errors=True)

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming" in second.stdout

    study = optuna.load_study(study_name="direction-cli", storage=storage)
    complete, failed = _cells(study, TrialState.COMPLETE), _cells(study, TrialState.FAIL)
    assert len(complete) == 3 and set(complete.values()) == {1}  # every cell complete exactly once
    assert study.trials[killed[0].number].state == TrialState.FAIL
    assert list(failed) == [killed[0].user_attrs[keys.CELL_KEY]]  # the killed cell, and it ran again
    assert len(study.trials) == 4

    parents, children = _child_runs(tracking, "direction-cli")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    statuses = {int(r.data.tags["hmer.trial"]): r.info.status for r in children}
    assert statuses[killed[0].number] == "FAILED"
    assert sorted(statuses.values()) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]


def _metrics(tracking: str, run_id: str) -> dict[str, list[float]]:
    """Every metric of a run: its values in step order (one per epoch, or the final one).

    One value per step: a worker killed after an epoch's metrics were logged but before its
    checkpoint was written repeats that epoch when resumed, and logs the same values again."""
    client = MlflowClient(tracking)
    out = {}
    for key in client.get_run(run_id).data.metrics:
        by_step = {m.step: m.value for m in sorted(client.get_metric_history(run_id, key),
                                                       key=lambda m: (m.step, m.timestamp))}
        out[key] = [by_step[step] for step in sorted(by_step)]
    return out


def test_a_killed_trial_continues_from_its_checkpoint(stores, tmp_path):
    """A worker killed after some epochs of a trial: the rerun continues that trial's MLflow run
    from its last checkpoint, and the cell ends with the numbers of a run that was never killed."""
    tracking, storage = stores
    data = write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    # Enough epochs to be killed in the middle; no wall-clock limit, so the numbers are the epochs'.
    cmd = _command(tmp_path, tracking, storage, "1", epochs=12, **{"train.time_budget_s": 0})
    env = _env(tmp_path)
    checkpoints = tmp_path / "mlruns" / "checkpoints"
    killed = _kill_after_two_checkpointed_epochs(cmd, env, tmp_path, "direction-cli", storage, tracking,
                                                 "two epochs of the first trial")
    epoch = int(load_checkpoint(checkpoints / killed["run_id"] / "last.pt")["epoch"])
    assert killed["epoch"] <= epoch < 12

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming run {killed['run_id']} from epoch {epoch + 1}" in second.stdout, second.stdout

    # Optuna: every cell complete once; the killed trial FAIL, its cell's new trial has its run.
    study = optuna.load_study(study_name="direction-cli", storage=storage)
    complete = _cells(study, TrialState.COMPLETE)
    assert len(complete) == 3 and set(complete.values()) == {1} and len(study.trials) == 4
    dead = study.trials[killed["trial"].number]
    assert dead.state == TrialState.FAIL
    again = next(t for t in study.get_trials(states=(TrialState.COMPLETE,))
                 if t.user_attrs[keys.CELL_KEY] == dead.user_attrs[keys.CELL_KEY])
    assert again.user_attrs[keys.TRIAL_RUN_ID] == killed["run_id"]
    assert again.user_attrs["hmer.resumed_from"]["trial"] == killed["trial"].number

    # MLflow: three children, all FINISHED; the killed run now belongs to the new trial.
    parents, children = _child_runs(tracking, "direction-cli")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(children) == 3
    assert all(r.info.status == "FINISHED" and r.data.tags["hmer.status"] == "finished" for r in children)
    run = next(r for r in children if r.info.run_id == killed["run_id"])
    assert run.data.tags["hmer.trial"] == str(again.number) and "hmer.error" not in run.data.tags
    assert run.data.tags["hmer.resumed"] == str(epoch + 1)
    assert not any(checkpoints.iterdir())  # the finished trials' checkpoints are gone

    # The same cell trained without a kill, in another study: the same epochs, the same numbers.
    direction = dead.params["model.direction"]
    spec = StudySpec(name="ablate_direction", description="one cell", axes={"model.direction": (direction,)},
                     model_presets=DIRECTION.model_presets)
    reference = run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking, data_path=str(data),
                               seeds=(1,), study_name="direction-reference", print_table=False,
                               overrides={**TINY, "train.epochs": 12, "train.time_budget_s": 0})
    assert reference.complete
    _, (uninterrupted,) = _child_runs(tracking, "direction-reference")
    resumed, expected = _metrics(tracking, killed["run_id"]), _metrics(tracking, uninterrupted.info.run_id)
    assert len(resumed["train_loss"]) == 12
    for key in ("train_loss", "val_exprate", "best_val_exprate", "test_2014_exprate", "test_2014_le1",
                "test_2014_le2", "test_2014_n"):
        if key in expected:
            assert resumed[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("weights_only", [False, True], ids=["exact", "weights-only"])
def test_a_study_published_unfinished_is_continued_from_the_committed_store_on_another_machine(
        stores, tmp_path, weights_only):
    """The workspace of a study that outlives its machine: the study is killed mid-trial, published
    with --keep-unfinished into a checkout's mlruns/ (the reports call it in progress), the
    workspace is gone; a workspace made from the checkout continues the killed trial's run from
    its committed checkpoint and finishes the study. With --weights-only the committed checkpoint
    is last.pt alone without the optimiser's state, and the run goes on as a tagged warm restart."""
    from hmer.reports.paper_claims import Claim, claims_table

    tracking, storage = stores
    write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    cmd, env = _command(tmp_path, tracking, storage, "1", epochs=6, **{"train.time_budget_s": 0}), _env(tmp_path)
    killed = _kill_after_two_checkpointed_epochs(cmd, env, tmp_path, "direction-cli", storage, tracking,
                                                 "two epochs of the first trial")
    epoch = int(load_checkpoint(tmp_path / "mlruns" / "checkpoints" / killed["run_id"] / "last.pt")["epoch"])

    checkout = tmp_path / "checkout"
    (checkout / "mlruns").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[project]\nname = "hmer"\n')
    at_checkout = {**env, "HMER_MLRUNS": str(checkout / "mlruns")}
    hmer = [sys.executable, "-m", "hmer.cli"]
    out = subprocess.run([*hmer, "runs", "publish", str(tmp_path / "mlruns"), "--keep-unfinished",
                          *["--weights-only"] * weights_only], capture_output=True, text=True, env=at_checkout,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # one worker runs the trials in order: the killed one is the first unless a loaded machine let the
    # first trial finish between two polls, and the trials before it are the finished ones
    finished = killed["trial"].number
    assert f"kept study direction-cli (running), in progress, {finished} of 3 trials finished" in out.stdout, \
        out.stdout
    # the smallest files that continue the trial in flight: last.pt, and best.pt only where the best
    # weights so far are not last.pt's own (the trainer writes best.pt again from them otherwise);
    # weights only: last.pt alone, whichever epoch was the best
    workspace_last = tmp_path / "mlruns" / "checkpoints" / killed["run_id"] / "last.pt"
    last = load_checkpoint(workspace_last)
    files = ["last.pt"] if last["best_epoch"] == last["epoch"] or weights_only else ["best.pt", "last.pt"]
    committed = checkout / "mlruns" / "checkpoints" / killed["run_id"]
    sizes = " + ".join(f"{f} {(committed / f).stat().st_size / 1e6:.1f} MB" for f in files)
    assert f"checkpoints kept of 1 unfinished run(s): {killed['run_id']} ({sizes})" in out.stdout, out.stdout
    kept = load_checkpoint(committed / "last.pt")
    assert (kept["optimizer"]["state"] == {}) == weights_only
    assert bool(kept.get("optimizer_state_dropped")) == weights_only
    if weights_only:
        assert (committed / "last.pt").stat().st_size < workspace_last.stat().st_size
        for key, value in kept["model"].items():  # the weights as trained: fp32, not rounded
            assert torch.equal(value, last["model"][key]), key
    assert sorted(p.relative_to(checkout / "mlruns").as_posix() for p in (checkout / "mlruns" / "checkpoints").rglob(
        "*")) == [f"checkpoints/{killed['run_id']}", *(f"checkpoints/{killed['run_id']}/{f}" for f in files)]
    assert (tmp_path / "mlruns" / "checkpoints" / killed["run_id"] / "best.pt").is_file()  # the workspace keeps both
    from hmer.store.clean import store_problems

    assert store_problems(checkout / "mlruns") == []  # nothing RUNNING in the published copy, no machine path
    published = f"sqlite:///{checkout / 'mlruns' / 'mlflow.db'}"
    # an unfinished study answers no claim yet, and its report says it will change
    claim = Claim("bi-vs-l2r", "bi beats l2r", "", "direction", (("bi", "l2r"),))  # no paper rows: one row
    assert claims_table("cli", published, claims=[claim])["verdict"].tolist() == [
        f"in progress, {finished} of 3 trials finished"]
    report = [*hmer, "report", "--study", "direction-cli", "--tracking-uri", published, "--out", str(tmp_path / "r")]
    out = subprocess.run(report, capture_output=True, text=True, env=at_checkout, cwd=tmp_path)
    assert f"study direction-cli: in progress, {finished} of 3 trials finished" in out.stdout, out.stdout + out.stderr
    shutil.rmtree(tmp_path / "mlruns")  # the machine that ran it is gone

    ws = tmp_path / "ws"
    out = subprocess.run([*hmer, "runs", "workspace", str(ws)], capture_output=True, text=True, env=at_checkout,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    cmd = [c.replace(tracking, f"sqlite:///{ws / 'mlflow.db'}").replace(storage, f"sqlite:///{ws / 'optuna.db'}")
           for c in cmd]
    second = subprocess.run(cmd, env={**env, "HMER_MLRUNS": str(ws)}, capture_output=True, text=True, cwd=REPO,
                            timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming run {killed['run_id']} from epoch {epoch + 1}" in second.stdout, second.stdout
    study = optuna.load_study(study_name="direction-cli", storage=f"sqlite:///{ws / 'optuna.db'}")
    complete = _cells(study, TrialState.COMPLETE)
    assert len(complete) == 3 and set(complete.values()) == {1}
    parents, children = _child_runs(f"sqlite:///{ws / 'mlflow.db'}", "direction-cli")
    assert parents[0].data.tags["hmer.status"] == "finished" and len(children) == 3
    resumed_tags = next(r for r in children if r.info.run_id == killed["run_id"]).data.tags
    assert resumed_tags["hmer.resumed"] == str(epoch + 1)
    assert ("hmer.warm_restart" in resumed_tags) == weights_only

    # published again, finished: no checkpoint is committed
    out = subprocess.run([*hmer, "runs", "publish", str(ws), "--keep-unfinished"], capture_output=True, text=True,
                         env=at_checkout, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kept study" not in out.stdout and not (checkout / "mlruns" / "checkpoints").exists()
    # (in a process of its own: this one's MLflow client still reads the database file it opened)
    out = subprocess.run(report, capture_output=True, text=True, env=at_checkout, cwd=tmp_path)
    assert out.returncode == 0 and "in progress" not in out.stdout, out.stdout + out.stderr


def _checkout_with_a_committed_store(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A checkout (its project file) whose mlruns/ holds a committed store, and that store's files' bytes."""
    from hmer.tracking.store import open_experiment

    checkout = tmp_path / "checkout"
    (checkout / "mlruns").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[project]\nname = "hmer"\n')
    uri = f"sqlite:///{checkout / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.set_terminated(client.create_run(open_experiment(uri, "committed")[1]).info.run_id)
    optuna.create_study(study_name="committed", storage=f"sqlite:///{checkout / 'mlruns' / 'optuna.db'}")
    return checkout, _files_of(checkout / "mlruns")


def _files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_trying_the_pipeline_leaves_the_committed_store_as_it_was(tmp_path):
    """The smoke budget, run from a checkout with no store named, is tracked in the scratch store
    scratch/, and the committed mlruns/ keeps every byte (issue 49)."""
    write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    checkout, committed = _checkout_with_a_committed_store(tmp_path)
    env = {k: v for k, v in _env(tmp_path).items() if k not in ("HMER_MLRUNS", "MLFLOW_TRACKING_URI")}
    cmd = [sys.executable, str(SCRIPT), "--budget", "smoke", "--seeds", "1", "--data", str(tmp_path / "data"),
           "--set", *[f"{k}={v}" for k, v in TINY.items()]]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=checkout, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    scratch = checkout / "scratch"
    assert f"budget smoke tries the pipeline in the scratch store {scratch}" in out.stdout, out.stdout
    assert _files_of(checkout / "mlruns") == committed
    study = optuna.load_study(study_name="ablate_direction-smoke", storage=f"sqlite:///{scratch / 'optuna.db'}")
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 3
    parents, children = _child_runs(f"sqlite:///{scratch / 'mlflow.db'}", "ablate_direction-smoke")
    assert len(parents) == 1 and len(children) == 3
    assert not (scratch / "checkpoints").exists() or not any((scratch / "checkpoints").iterdir())


def test_a_study_tracked_elsewhere_keeps_its_checkpoints_there_and_writes_nothing_into_the_checkout(tmp_path):
    """A study given --storage and a tracking URI elsewhere checkpoints its trials beside that
    store, not in the checkout's mlruns/ (issue 49)."""
    write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    checkout, committed = _checkout_with_a_committed_store(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # (read by the test while the study starts)
    tracking, storage = f"sqlite:///{elsewhere / 'mlflow.db'}", f"sqlite:///{elsewhere / 'optuna.db'}"
    env = {k: v for k, v in _env(tmp_path).items() if k not in ("HMER_MLRUNS", "MLFLOW_TRACKING_URI")}
    # More epochs than the kill can miss: a trial that ended between the poll and SIGKILL would have
    # removed its checkpoint (once on a loaded 2-core CI machine with 6 epochs); it is never resumed.
    cmd = _command(tmp_path, tracking, storage, "1", epochs=40, **{"train.time_budget_s": 0})
    killed = _kill_after_two_checkpointed_epochs(cmd, env, tmp_path, "direction-cli", storage, tracking,
                                                 "two checkpointed epochs", cwd=checkout)
    assert (elsewhere / "checkpoints" / killed["run_id"] / "last.pt").is_file()
    assert _files_of(checkout / "mlruns") == committed and sorted(p.name for p in checkout.iterdir()) == [
        "mlruns", "pyproject.toml"]


def test_a_trial_another_worker_fails_while_it_runs_is_dropped_and_its_cell_runs_again(stores, capsys):
    """A worker whose heartbeat was silent past the grace period (a database outage, a frozen
    machine) has its trial failed by another worker's heartbeat check while it trains. Optuna then
    refuses the trial's result ("Cannot tell a FAIL trial."): the worker says so and goes on, the
    run it trained is marked FAILED, and the next run of the command takes the cell up again (on
    this machine, from the dropped run's last checkpoint: its epochs are not trained twice)."""
    from hmer.studies.storage import open_storage, trial_id

    tracking, storage = stores
    spec = StudySpec(name="ablate_direction", description="one cell", axes={"model.direction": ("l2r",)},
                     model_presets=DIRECTION.model_presets)
    failed: list[int] = []
    # opened here: the worker's thread importing SQLAlchemy's and MLflow's modules while the study
    # does would meet them half-initialised
    store, client = open_storage(storage), MlflowClient(tracking)
    client.search_experiments()

    def other_worker() -> None:
        """Fails the trial once its run has logged an epoch, as Optuna's heartbeat check does."""
        deadline = time.monotonic() + 600
        while not failed and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                study = optuna.load_study(study_name="dropped", storage=store)
            except KeyError:
                continue
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            experiment = client.get_experiment_by_name("dropped")
            runs = [] if not running or experiment is None else client.search_runs(
                [experiment.experiment_id], filter_string=f"tags.`hmer.trial` = '{running[0].number}'")
            if runs and client.get_metric_history(runs[0].info.run_id, "train_loss"):
                if store.set_trial_state_values(trial_id(store, study, running[0].number), TrialState.FAIL):
                    failed.append(running[0].number)

    thread = threading.Thread(target=other_worker)
    thread.start()
    try:
        first = run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), seeds=(1,),
                               overrides={**TINY, "train.epochs": 4, "train.time_budget_s": 0},
                               study_name="dropped", print_table=False)
    finally:
        thread.join()
    assert failed == [0]
    assert not first.complete and first.failed == ["model.direction=l2r, train.seed=1"]
    assert "trial 0: was marked FAIL by another worker while it ran" in capsys.readouterr().out
    _, (dropped,) = _child_runs(tracking, "dropped")
    assert dropped.info.status == "FAILED"

    again = run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), seeds=(1,),
                           overrides={**TINY, "train.epochs": 4, "train.time_budget_s": 0},
                           study_name="dropped", print_table=False)
    assert again.complete
    study = optuna.load_study(study_name="dropped", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert study.trials[1].user_attrs[keys.TRIAL_RUN_ID] == dropped.info.run_id
    _, children = _child_runs(tracking, "dropped")
    assert [r.info.status for r in children] == ["FINISHED"]


def test_two_workers_on_one_study_never_run_a_cell_twice(stores, tmp_path):
    """Two commands on one storage, as on two machines; the second also starts a worker of its
    own with --n-jobs 2. Nine cells, three workers: each cell runs once, in one MLflow study."""
    tracking, storage = stores
    write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    cmd, env = _command(tmp_path, tracking, storage, "3"), _env(tmp_path)
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
             for args in (cmd, [*cmd, "--n-jobs", "2"])]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out

    study = optuna.load_study(study_name="direction-cli", storage=storage)
    assert len(study.trials) == 9
    complete = _cells(study, TrialState.COMPLETE)
    assert len(complete) == 9 and set(complete.values()) == {1}
    workers = collections.Counter(t.user_attrs[keys.WORKER]["pid"] for t in study.trials)
    assert procs[0].pid in workers and len(workers) >= 2, workers
    parents, children = _child_runs(tracking, "direction-cli")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(children) == 9
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    assert all("l2r (baseline)" in out for out in outputs)  # each command ends with the table


def test_a_waiting_worker_interrupted_says_it_ran_no_trial_and_the_others_trials_go_on(stores, tmp_path):
    """A command whose study has no cell left to book waits for the workers that run them; stopped with
    SIGTERM there, it says it ran none, and the others' trials run on, none marked FAIL."""
    tracking, storage = stores
    write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    cmd, env = _command(tmp_path, tracking, storage, "1", epochs=500), _env(tmp_path)  # three long cells
    waiting = None
    with open(tmp_path / "busy.log", "w") as busy_log, open(tmp_path / "waiting.log", "w") as waiting_log:
        busy = subprocess.Popen([*cmd, "--n-jobs", "3"], env=env, stdout=busy_log, stderr=subprocess.STDOUT,
                                cwd=REPO, start_new_session=True)
        try:
            def all_three_running() -> bool:
                try:
                    study = optuna.load_study(study_name="direction-cli", storage=storage)
                except KeyError:
                    return False
                return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))) == 3

            _wait_for(all_three_running, busy, 240, "three trials running")
            os.kill(busy.pid, signal.SIGCONT)
            waiting = subprocess.Popen(cmd, env=env, stdout=waiting_log, stderr=subprocess.STDOUT, cwd=REPO)
            _wait_for(lambda: "waiting: other workers run the last trials" in (tmp_path / "waiting.log").read_text(),
                      waiting, 240, "the second command waiting")
            waiting.send_signal(signal.SIGTERM)
            os.kill(waiting.pid, signal.SIGCONT)
            waiting.wait(timeout=60)
            study = optuna.load_study(study_name="direction-cli", storage=storage)
            states = [t.state for t in study.trials]
        finally:
            if waiting is not None and waiting.poll() is None:  # it did not end on SIGTERM: not left to take up
                waiting.kill()                                    # the killed command's trials
                waiting.wait()
            os.killpg(busy.pid, signal.SIGKILL)  # the command and its two extra workers
            busy.wait()
    said = (tmp_path / "waiting.log").read_text()
    assert "interrupted while waiting: this worker ran no trial; the other workers' trials go on" in said, said
    assert "marked FAIL" not in said, said
    assert states == [TrialState.RUNNING] * 3, states


# The tiny datasets are images, not ink: the sweep without what redraws strokes (renderer
# augmentation, the second validation style). tests/test_data_shared.py runs the whole space on InkML.
IMAGE_SWEEP = dataclasses.replace(
    SWEEP, params=tuple(p for p in SWEEP.params if p.key != "data.aug_share"),
    fixed={k: v for k, v in SWEEP.fixed.items() if k != "data.val_alt"})


def test_sweep_prunes_and_marks_pruned_trials_in_optuna_and_mlflow(stores):
    tracking, storage = stores
    # A real pruner that stops every trial at its first report: each trial is pruned after epoch 1.
    outcome = run_sweep(IMAGE_SWEEP, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), n_trials=2,
                        overrides={**TINY, "train.epochs": 2}, study_name="sweep-test",
                        pruner=optuna.pruners.ThresholdPruner(lower=101.0))
    assert outcome.complete
    study = optuna.load_study(study_name="sweep-test", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.PRUNED, TrialState.PRUNED]
    assert all(set(t.params) == {p.name for p in IMAGE_SWEEP.params} for t in study.trials)
    _, children = _child_runs(tracking, "sweep-test")
    assert len(children) == 2
    for run in children:
        assert run.info.status == "KILLED" and run.data.tags["hmer.status"] == "pruned"

    # At the end of its training a trial is scored, never pruned: with one epoch its only report is
    # at 100 % of its training, and the same pruner lets it finish.
    whole = run_sweep(IMAGE_SWEEP, "smoke", storage=storage, tracking_uri=tracking, data=tiny_data(), n_trials=1,
                      overrides={**TINY, "train.epochs": 1}, study_name="sweep-last-report",
                      pruner=optuna.pruners.ThresholdPruner(lower=101.0))
    (trial,) = optuna.load_study(study_name="sweep-last-report", storage=storage).trials
    assert whole.complete and trial.state == TrialState.COMPLETE and list(trial.intermediate_values) == [100]


SWEEP_SCRIPT = """
import dataclasses, sys
import optuna
import pandas as pd
from hmer.studies import run_sweep
from hmer.studies.budgets import BUDGETS
sys.path.insert(0, {tests!r})
from test_studies import IMAGE_SWEEP, TINY
# a budget whose trials get CPU-minutes: each measures its cost and trains the epochs that fit
budget = dataclasses.replace(BUDGETS["smoke"], sweep_trial_cpu_minutes={minutes})
run_sweep(IMAGE_SWEEP, budget, storage={storage!r}, tracking_uri={tracking!r}, data_path={data!r}, n_trials=1,
          n_jobs=1, study_name="sweep-kill", overrides={{**TINY, "train.time_budget_s": 0}},
          pruner=optuna.pruners.NopPruner())
"""


@pytest.mark.parametrize("restart", ["at once", "after the heartbeat's grace period"])
def test_a_killed_sweep_trial_continues_from_its_checkpoint_with_its_parameters_and_epochs(stores, tmp_path,
                                                                                           restart):
    """A sweep's worker killed mid-trial: the rerun books the dead trial and runs a trial with its
    parameters, which takes its measured cost and fitted epochs rather than measuring again, and
    continues its MLflow run from the checkpoint; the study ends with one COMPLETE trial. A rerun
    after the grace period (the next session's) finds the trial stale by Optuna's heartbeat rather
    than by its process id, and continues it all the same."""
    tracking, storage = stores
    data = write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    script = SWEEP_SCRIPT.format(tests=str(REPO / "tests"), minutes=0.05, storage=storage, tracking=tracking,
                                 data=str(data))
    cmd, env = [sys.executable, "-c", script], {**_env(tmp_path), "HMER_STUDY_HEARTBEAT_S": "1"}
    killed = _kill_after_two_checkpointed_epochs(cmd, env, tmp_path, "sweep-kill", storage, tracking,
                                                 "two epochs of the first sweep trial")
    dead = killed["trial"]
    epochs = dead.user_attrs[keys.TRIAL_FITTED_EPOCHS]
    assert killed["epoch"] < epochs, "the trial finished before it could be killed: give it more CPU-minutes"
    if restart != "at once":
        time.sleep(3 * 1 + 2)  # past the grace period (3 heartbeats of 1 s)

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 continue from their last epoch" in second.stdout, second.stdout
    assert f"resuming run {killed['run_id']} from epoch" in second.stdout, second.stdout

    study = optuna.load_study(study_name="sweep-kill", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    again = study.trials[1]
    assert again.params == dead.params and again.user_attrs[keys.CONTINUES] == dead.number
    table = sweep_table(study)
    assert "1 of the failed continued by a later trial" in table and "FAIL->1" in table, table
    for key in (keys.TRIAL_CPU_SECONDS_PER_IMAGE, keys.TRIAL_FITTED_EPOCHS, keys.CELL_KEY):
        assert again.user_attrs[key] == dead.user_attrs[key], key
    assert again.user_attrs[keys.TRIAL_RUN_ID] == killed["run_id"]
    _, children = _child_runs(tracking, "sweep-kill")
    assert [r.info.run_id for r in children] == [killed["run_id"]] and children[0].info.status == "FINISHED"
    assert len(_metrics(tracking, killed["run_id"])["train_loss"]) == epochs


# ---- a study in one file ------------------------------------------------------------------------------

def test_every_module_of_the_suite_registers_its_study_under_its_own_name():
    import pkgutil

    from hmer.studies import suite

    modules = [info.name for info in pkgutil.iter_modules(suite.__path__)]
    assert sorted(STUDIES) == sorted(modules) and "ablate_direction" in modules and "sweep" in modules
    assert all(STUDIES.get(name).name == name for name in modules)
    assert set(ablations()) == set(modules) - {"sweep"}  # the grid studies
    with pytest.raises(ValueError, match="no_such_study"):
        STUDIES.get("no_such_study")


def test_a_study_registered_here_alone_runs_by_name(stores, tmp_path, capsys):
    """A spec registered in this file is found by `hmer.studies` and run by name as a script runs its own."""
    from hmer.cli.study import run_study

    tracking, storage = stores
    write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    spec = StudySpec(name="toy_direction", description="a toy: l2r against r2l",
                     axes={"model.direction": ("l2r", "r2l")}, model_presets=DIRECTION.model_presets)
    STUDIES.register(spec.name, spec)
    try:
        assert ablations()["toy_direction"] is spec
        status = run_study("toy_direction", [
            "--budget", "smoke", "--seeds", "1", "--data", str(tmp_path / "data"), "--tracking-uri", tracking,
            "--storage", storage, "--set", *[f"{k}={v}" for k, v in TINY.items()]])
    finally:
        STUDIES.unregister("toy_direction")
    assert status == 0 and "toy_direction" not in ablations()
    parents, children = _child_runs(tracking, "toy_direction-smoke")
    assert len(parents) == 1 and sorted(r.data.params["model.direction"] for r in children) == ["l2r", "r2l"]
    assert all(r.info.status == "FINISHED" for r in children)


def test_a_cell_another_study_trained_with_the_same_config_is_copied_not_trained(stores, tmp_path):
    """The direction study's bi cell is a decoder comparison's transformer cell: the second study
    copies that run (metrics, artifacts, parent link) instead of training it, and counts no cost for it."""
    from hmer.studies.mlflow_runs import measured_cost
    from hmer.studies.objective import find_trained
    from hmer.config import Config

    tracking, storage = stores
    data = tiny_data()
    # no time limit: the smoke budget divides its window by the grid's size, so 3 cells and 2 differ
    held = {**TINY, "train.time_budget_s": 0}
    run_grid_study(DIRECTION, "smoke", storage=storage, tracking_uri=tracking, data=data, seeds=(1,),
                   overrides=held, study_name="direction-test")
    _, direction_runs = _child_runs(tracking, "direction-test")
    bi = next(r for r in direction_runs if r.data.params["model.direction"] == "bi")

    spec = StudySpec(name="toy_decoder", description="a toy: transformer against ConvS2S",
                     axes={"model.decoder": ("transformer", "convs2s")}, model_presets=DIRECTION.model_presets)
    outcome = run_grid_study(spec, "smoke", storage=storage, tracking_uri=tracking, data=data, seeds=(1,),
                             overrides=held, study_name="decoder-test")
    assert outcome.complete
    parents, runs = _child_runs(tracking, "decoder-test")
    copied = next(r for r in runs if r.data.params["model.decoder"] == "transformer")
    trained = next(r for r in runs if r.data.params["model.decoder"] == "convs2s")
    assert copied.data.tags[keys.REUSED_FROM] == bi.info.run_id and keys.REUSED_FROM not in trained.data.tags
    assert copied.data.tags[keys.STUDY] == "decoder-test" and copied.data.tags[keys.VARIANT] == "transformer"
    assert copied.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert copied.data.tags[keys.GIT_COMMIT] == bi.data.tags[keys.GIT_COMMIT]
    assert copied.data.params == bi.data.params and copied.data.metrics == bi.data.metrics
    client = MlflowClient(tracking)
    assert [m.value for m in client.get_metric_history(copied.info.run_id, "val_exprate")] == \
        [m.value for m in client.get_metric_history(bi.info.run_id, "val_exprate")]
    names = {a.path for a in client.list_artifacts(copied.info.run_id)}
    assert {"model", "predictions", "config.json"} <= names
    assert {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(copied.info.run_id, "predictions")} == \
        {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(bi.info.run_id, "predictions")}

    study = optuna.load_study(study_name="decoder-test", storage=storage)
    trial = next(t for t in study.trials if t.params["model.decoder"] == "transformer")
    assert trial.state == TrialState.COMPLETE and trial.value == bi.data.metrics["best_val_exprate"]
    assert trial.user_attrs[keys.REUSED_FROM]["run"] == bi.info.run_id
    assert trial.user_attrs["hmer.test_2014_exprate"] == bi.data.metrics["test_2014_exprate"]
    cost = measured_cost(client, parents[0].info.experiment_id, "decoder-test")
    assert cost.startswith("measured on its 1 finished trial(s)") and "1 trial(s) copied" in cost
    # the study started when its parent run did, not when the run it copied had
    from hmer.reports import list_studies
    listed = list_studies(tracking).set_index("study")
    assert listed.loc["decoder-test", "started"] == pd.to_datetime(parents[0].info.start_time, unit="ms", utc=True)
    assert listed.loc["decoder-test", "started"] > pd.to_datetime(copied.info.start_time, unit="ms", utc=True)

    # Only the same config is the same cell: another seed or another dropout trains.
    stored = json.loads(Path(client.download_artifacts(bi.info.run_id, "config.json", str(tmp_path))).read_text())
    cfg = Config.from_dict(stored)
    assert find_trained(client, cfg, "another").run_id == bi.info.run_id
    assert find_trained(client, cfg.override({"train.seed": 2}), "another") is None
    assert find_trained(client, cfg.override({"model.dropout": 0.25}), "another") is None
    assert find_trained(client, cfg, "direction-test") is None  # a study never copies its own runs
    # Only the same code is the same computation: a run whose training code had another fingerprint,
    # or whose resume ran other code, trains again.
    from hmer.training.fingerprint import code_fingerprint

    assert bi.data.tags[keys.FINGERPRINT] == copied.data.tags[keys.FINGERPRINT] == code_fingerprint()
    client.set_tag(bi.info.run_id, keys.FINGERPRINT_CHANGED, f"epoch 2: {'0' * 16}")
    assert find_trained(client, cfg, "another") is None
    client.delete_tag(bi.info.run_id, keys.FINGERPRINT_CHANGED)
    client.set_tag(bi.info.run_id, keys.FINGERPRINT, "0" * 16)
    assert find_trained(client, cfg, "another") is None
