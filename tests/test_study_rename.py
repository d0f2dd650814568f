"""`hmer runs rename`: a study renamed in a copy of a real smoke study's store (MLflow and Optuna),
read back under its new name as before; bad names refused on one line with nothing changed; an
interrupted rename finished by running it again."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from study_store import STUDY_NAME, study_store

from hmer.cli import main as hmer_main
from hmer.reports import load_runs, study_table
from hmer.store.clean import store_problems
from hmer.tracking import keys
from hmer.tracking.portable import copy_store

NEW = f"{STUDY_NAME}-superseded"


@pytest.fixture
def store(tmp_path_factory, tmp_path):
    """A private copy of the smoke study's store, so that renaming leaves the shared one alone."""
    shared = study_store(tmp_path_factory.getbasetemp() / "report-study-store")
    db = copy_store(shared.root, tmp_path / "store", portable=False)
    return f"sqlite:///{db}", f"sqlite:///{db.parent / 'optuna.db'}"


def _trials(storage: str, name: str):
    return [(t.number, t.state, t.params, t.user_attrs, t.values)
            for t in optuna.load_study(study_name=name, storage=storage).trials]


def _digest(tracking: str, storage: str) -> str:
    return "".join(hashlib.sha256(open(url[len("sqlite:///"):], "rb").read()).hexdigest()
                   for url in (tracking, storage))


def test_a_renamed_study_reads_back_under_its_new_name_as_before(store, capsys):
    tracking, storage = store
    before_runs = load_runs(tracking, study=STUDY_NAME)
    before_table = study_table(STUDY_NAME, tracking, runs=before_runs)
    before_trials = _trials(storage, STUDY_NAME)
    every = load_runs(tracking, study=STUDY_NAME, include_parents=True)  # + the parent and the summary runs

    assert hmer_main(["runs", "rename", STUDY_NAME, NEW, "--tracking-uri", tracking]) == 0
    out = capsys.readouterr().out
    assert f"renamed study {STUDY_NAME} to {NEW}: {len(every)} run(s) retagged" in out

    client = MlflowClient(tracking)
    assert client.get_experiment_by_name(STUDY_NAME) is None and client.get_experiment_by_name(NEW) is not None
    parent = client.search_runs([client.get_experiment_by_name(NEW).experiment_id],
                                filter_string="tags.`hmer.role` = 'study'")[0]
    assert parent.info.run_name == NEW and parent.data.params["study"] == NEW  # named after its study
    assert optuna.load_study(study_name=NEW, storage=storage).user_attrs[keys.EXPERIMENT] == NEW
    # (the store of a study run here names this machine's folders; `hmer runs publish` writes them portably)
    problems = store_problems(Path(tracking[len("sqlite:///"):]).parent)
    assert not [p for p in problems if "machine path" not in p.what], problems
    assert load_runs(tracking, study=STUDY_NAME).empty
    after_runs = load_runs(tracking, study=NEW)
    assert sorted(after_runs["run_id"]) == sorted(before_runs["run_id"])
    assert study_table(NEW, tracking, runs=after_runs).equals(before_table)
    assert _trials(storage, NEW) == before_trials
    assert STUDY_NAME not in {s.study_name for s in optuna.get_all_study_summaries(storage)}
    assert hmer_main(["report", "--list", "--tracking-uri", tracking]) == 0
    listed = capsys.readouterr().out
    assert NEW in listed and f"{STUDY_NAME} " not in listed


def test_bad_names_are_refused_in_one_line_and_change_nothing(store, capsys):
    tracking, storage = store
    optuna.create_study(study_name="taken", storage=storage)
    before = _digest(tracking, storage)
    for argv, says in [
        (["no-such-study", NEW], "no study 'no-such-study'"),
        ([STUDY_NAME, "taken"], "already has an Optuna study 'taken'"),
        ([STUDY_NAME, STUDY_NAME], "give a new name other than the study's own"),
        ([STUDY_NAME, "../../etc/x"], "a study's name is 1-100 letters, digits"),  # issue 70: it names a folder
        ([STUDY_NAME, "a b"], "a study's name is 1-100 letters, digits"),
    ]:
        assert hmer_main(["runs", "rename", *argv, "--tracking-uri", tracking]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
    assert _digest(tracking, storage) == before


def test_a_study_with_a_running_trial_is_refused(store, capsys):
    tracking, storage = store
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    study.ask()  # a RUNNING trial, as a live worker leaves it
    assert hmer_main(["runs", "rename", STUDY_NAME, NEW, "--tracking-uri", tracking]) == 2
    assert "1 RUNNING trial(s)" in capsys.readouterr().err
    assert MlflowClient(tracking).get_experiment_by_name(NEW) is None


def test_a_running_trial_whose_worker_is_gone_is_marked_failed_and_the_study_renamed(store, capsys):
    tracking, storage = store
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    worker = subprocess.Popen([sys.executable, "-c", "pass"])
    worker.wait()  # a worker of this host, killed mid-trial
    trial = study.ask()
    trial.set_user_attr(keys.WORKER, {"host": socket.gethostname(), "pid": worker.pid, "started": "", "token": "gone"})
    assert hmer_main(["runs", "rename", STUDY_NAME, NEW, "--tracking-uri", tracking]) == 0
    renamed = optuna.load_study(study_name=NEW, storage=storage).trials[trial.number]
    assert renamed.state == optuna.trial.TrialState.FAIL
    assert "marked FAIL by hmer runs rename" in renamed.user_attrs[keys.FAILED_BY]


def test_an_interrupted_rename_is_finished_by_running_it_again(store, capsys):
    tracking, storage = store
    before_trials = _trials(storage, STUDY_NAME)
    # interrupted after its first steps: the Optuna study copied, one run retagged
    optuna.copy_study(from_study_name=STUDY_NAME, from_storage=storage, to_storage=storage, to_study_name=NEW)
    client = MlflowClient(tracking)
    first = load_runs(tracking, study=STUDY_NAME)["run_id"].iloc[0]
    client.set_tag(first, keys.STUDY, NEW)

    assert hmer_main(["runs", "rename", STUDY_NAME, NEW, "--tracking-uri", tracking]) == 0
    assert load_runs(tracking, study=STUDY_NAME).empty and first in set(load_runs(tracking, study=NEW)["run_id"])
    assert _trials(storage, NEW) == before_trials
    assert STUDY_NAME not in {s.study_name for s in optuna.get_all_study_summaries(storage)}
    capsys.readouterr()
    assert hmer_main(["runs", "rename", STUDY_NAME, NEW, "--tracking-uri", tracking]) == 2
    assert "already renamed?" in capsys.readouterr().err


def test_a_kept_study_is_labelled_as_superseded_by_its_rerun(store, capsys):
    """Issue 25: the study a re-run replaces stays in the store, renamed and labelled as superseded:
    a tag on its experiment and parent run, the experiment's description, and `hmer report --list`."""
    tracking, storage = store
    assert hmer_main(["runs", "rename", STUDY_NAME, NEW, "--tracking-uri", tracking]) == 0
    capsys.readouterr()
    assert hmer_main(["runs", "supersede", NEW, STUDY_NAME, "--tracking-uri", tracking]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"no study '{STUDY_NAME}'" in err, err  # the re-run is not there yet

    client = MlflowClient(tracking)
    client.create_experiment(STUDY_NAME)  # the re-run under the old name
    assert hmer_main(["runs", "supersede", NEW, STUDY_NAME, "--tracking-uri", tracking]) == 0
    assert f"Superseded by the study {STUDY_NAME}" in capsys.readouterr().out
    experiment = client.get_experiment_by_name(NEW)
    assert experiment.tags[keys.SUPERSEDED_BY] == STUDY_NAME
    assert experiment.tags[keys.MLFLOW_NOTE].startswith(f"Superseded by the study {STUDY_NAME}")
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.`hmer.role` = 'study'")
    assert parent.data.tags[keys.SUPERSEDED_BY] == STUDY_NAME
    before = _digest(tracking, storage)
    assert hmer_main(["runs", "supersede", NEW, STUDY_NAME, "--tracking-uri", tracking]) == 0
    assert _digest(tracking, storage) == before  # labelled once: a second call writes nothing

    capsys.readouterr()
    assert hmer_main(["report", "--list", "--tracking-uri", tracking]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(NEW))
    assert f"finished, superseded by {STUDY_NAME}" in row, row
    # issue 70: the successor superseded by the study it supersedes would be a cycle, which leaves no study to read
    before = _digest(tracking, storage)
    assert hmer_main(["runs", "supersede", STUDY_NAME, NEW, "--tracking-uri", tracking]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{NEW} -> {STUDY_NAME}" in err, err
    assert _digest(tracking, storage) == before


def test_superseding_a_study_that_stopped_unfinished_closes_its_parent_run_with_its_table(store, capsys):
    """Nothing continues a superseded study: a parent run it left RUNNING is closed, at its last
    trial's end, and gets the study's table as it stands, as a finished study's parent run has it."""
    from hmer.store.study_run import TABLE_ARTIFACT
    from hmer.tracking.portable import list_run_artifacts

    tracking, storage = store
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(STUDY_NAME)
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.`hmer.role` = 'study'")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.info.run_id != parent.info.run_id]
    # as the superseded decoder study stopped: its parent run RUNNING, without a table
    client.update_run(parent.info.run_id, status="RUNNING")
    client.set_tag(parent.info.run_id, keys.STATUS, "running")
    client.delete_tag(parent.info.run_id, keys.MLFLOW_NOTE)
    (Path(parent.info.artifact_uri[len("file://"):]) / TABLE_ARTIFACT).unlink()
    assert hmer_main(["runs", "rename", STUDY_NAME, NEW, "--tracking-uri", tracking]) == 0
    client.create_experiment(STUDY_NAME)
    assert hmer_main(["runs", "supersede", NEW, STUDY_NAME, "--tracking-uri", tracking]) == 0

    closed = client.get_run(parent.info.run_id)
    assert closed.info.status == "KILLED" and closed.data.tags[keys.STATUS] == "incomplete"
    assert closed.info.end_time == max(r.info.end_time for r in runs)
    assert TABLE_ARTIFACT in list_run_artifacts(client, parent.info.run_id)
    assert "| none (baseline) | 1 |" in closed.data.tags[keys.MLFLOW_NOTE]
    capsys.readouterr()
    assert hmer_main(["report", "--list", "--tracking-uri", tracking]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(NEW))
    assert f"stopped unfinished, superseded by {STUDY_NAME}" in row, row
