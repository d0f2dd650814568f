"""A committed MLflow store opens from any clone path (issue 12): artifact locations made relative
to the checkout, read by MLflow from the checkout and by the suite from anywhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from mlflow.tracking import MlflowClient

from hmer.reports.analysis import prediction_years
from hmer.tracking.portable import download_run_artifact, list_run_artifacts, make_portable, resolve_artifact_uri
from hmer.tracking.store import artifact_root_for, open_experiment


def _store_with_one_run(checkout):
    (checkout / "mlruns").mkdir(parents=True)
    uri = f"sqlite:///{checkout / 'mlruns' / 'mlflow.db'}"
    experiment_id = open_experiment(uri, "results")[1]
    client = MlflowClient(uri)
    run = client.create_run(experiment_id)
    client.log_text(run.info.run_id, "name,truth,prediction,distance\nx,a,a,0\n", "predictions/test_2014.csv")
    client.set_terminated(run.info.run_id)
    assert client.get_run(run.info.run_id).info.artifact_uri.startswith("file:///")  # MLflow's absolute default
    return run.info.run_id


def test_a_portable_store_reads_its_artifacts_after_the_checkout_moves(tmp_path, monkeypatch):
    run_id = _store_with_one_run(tmp_path / "first")
    assert make_portable(tmp_path / "first" / "mlruns" / "mlflow.db") == 3  # two experiments (with Default) and the run
    shutil.move(tmp_path / "first", tmp_path / "clone")  # a clone somewhere else; the old path is gone
    uri = f"sqlite:///{tmp_path / 'clone' / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.artifact_uri == f"mlruns/artifacts/results/{run_id}/artifacts"

    # The suite's readers, from a working directory that is not the checkout (a notebook's folder):
    monkeypatch.chdir(tmp_path)
    local = download_run_artifact(client, run_id, "predictions/test_2014.csv", str(tmp_path / "dl"))
    assert open(local).read().startswith("name,truth")
    assert list_run_artifacts(client, run_id, "predictions") == ["test_2014.csv"]
    assert prediction_years(run_id, uri) == ["2014"]  # the error analysis finds the run's predictions
    assert resolve_artifact_uri("mlruns/artifacts/x", uri) == (tmp_path / "clone" / "mlruns/artifacts/x").as_uri()
    assert resolve_artifact_uri("file:///else/where", uri) == "file:///else/where"

    # MLflow itself, started from the checkout as the README says (`mlflow ui` reads the same way):
    script = ("from mlflow.tracking import MlflowClient; c = MlflowClient('sqlite:///mlruns/mlflow.db'); "
              f"print([a.path for a in c.list_artifacts('{run_id}', 'predictions')])")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path / "clone", capture_output=True, text=True)
    assert "predictions/test_2014.csv" in out.stdout, out.stderr


def test_make_portable_names_no_local_folder_and_leaves_remote_locations_alone(tmp_path):
    run_id = _store_with_one_run(tmp_path / "c")
    db = tmp_path / "c" / "mlruns" / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    remote = client.create_experiment("remote", artifact_location="s3://bucket/hmer")
    make_portable(db)
    assert make_portable(db) == 0  # idempotent
    assert client.get_run(run_id).info.artifact_uri.startswith("mlruns/artifacts/")
    # MLflow's Default experiment lives in its default root outside artifacts/, under the folder the
    # store was made in: a committed store must not name it
    assert client.get_experiment("0").artifact_location == "mlruns/artifacts/0"
    assert client.get_experiment(remote).artifact_location == "s3://bucket/hmer"
    assert str(tmp_path) not in db.read_bytes().decode("latin-1")


def test_publish_and_workspace_round_trip(tmp_path):
    """A study's store in a work folder -> published into a checkout's mlruns/ (portable) -> a
    workspace copy (absolute again) where a new run logs artifacts, from any working directory."""
    work = tmp_path / "work"
    run_id = _store_with_one_run(work)  # work/mlruns/mlflow.db
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{work / 'mlruns' / 'optuna.db'}")
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    # a study still training in the workspace: its parent run says so, its trial has a run and an artifact
    client = MlflowClient(f"sqlite:///{work / 'mlruns' / 'mlflow.db'}")
    # its artifacts in the workspace, as a study's are (open_experiment): MLflow's default is ./mlruns/<id> under the
    # working folder, the checkout's own mlruns/ when the tests run from it (issue 70: an empty mlruns/2/<id> left)
    training = client.create_experiment("ablate_x-cpu",
                                        artifact_location=(work / "mlruns" / "artifacts" / "ablate_x-cpu").as_uri())
    parent = client.create_run(training, tags={"hmer.study": "ablate_x-cpu", "hmer.role": "study",
                                               "hmer.status": "running"})
    child = client.create_run(training, tags={"hmer.study": "ablate_x-cpu", "hmer.trial": "0",
                                              "mlflow.parentRunId": parent.info.run_id})
    client.log_text(child.info.run_id, "half", "half.txt")
    optuna.create_study(study_name="ablate_x-cpu", storage=f"sqlite:///{work / 'mlruns' / 'optuna.db'}")
    (work / "mlruns" / "checkpoints").mkdir()
    (work / "mlruns" / "checkpoints" / "last.pt").write_bytes(b"never published")
    checkout, env = _checkout(tmp_path)
    out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "publish", str(work / "mlruns")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "left out study ablate_x-cpu (running)" in out.stdout
    published_storage = f"sqlite:///{checkout / 'mlruns' / 'optuna.db'}"
    published = optuna.load_study(study_name="s", storage=published_storage)
    assert [t.params for t in published.trials] == [t.params for t in study.trials]
    assert [s.study_name for s in optuna.get_all_study_summaries(published_storage)] == ["s"]
    assert not (checkout / "mlruns" / "checkpoints").exists()
    client = MlflowClient(f"sqlite:///{checkout / 'mlruns' / 'mlflow.db'}")
    assert client.get_run(run_id).info.artifact_uri.startswith("mlruns/artifacts/")
    assert client.get_experiment_by_name("ablate_x-cpu") is None  # purged, not only marked deleted
    assert not list((checkout / "mlruns" / "artifacts").rglob(child.info.run_id))  # nor an empty folder
    # the workspace keeps it
    assert MlflowClient(f"sqlite:///{work / 'mlruns' / 'mlflow.db'}").get_run(child.info.run_id)

    out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "workspace", str(tmp_path / "more")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    more = MlflowClient(f"sqlite:///{tmp_path / 'more' / 'mlflow.db'}")
    assert more.get_run(run_id).info.artifact_uri == (tmp_path / "more" / "artifacts" / "results" / run_id /
                                                       "artifacts").as_uri()
    new = more.create_run(more.get_experiment_by_name("results").experiment_id)
    more.log_text(new.info.run_id, "x", "a.txt")
    assert (tmp_path / "more" / "artifacts" / "results" / new.info.run_id / "artifacts" / "a.txt").is_file()


def test_checkpoints_are_copied_only_when_asked_and_never_half_written(tmp_path):
    from hmer.tracking.portable import copy_store

    work = tmp_path / "work"
    _store_with_one_run(work)
    run = work / "mlruns" / "checkpoints" / "0123abcd"
    run.mkdir(parents=True)
    (run / "last.pt").write_bytes(b"epoch 4")
    (run / ".last.pt.x1y2.tmp").write_bytes(b"epoch 5, half written")
    (work / "mlruns" / "checkpoints" / "stray.txt").write_text("not a run's folder")
    dest = tmp_path / "dest"
    (dest / "checkpoints" / "old").mkdir(parents=True)  # what the destination had is replaced

    copy_store(work / "mlruns", dest, portable=False)
    assert not (dest / "checkpoints").exists()
    copy_store(work / "mlruns", dest, portable=False, checkpoints=True)
    assert sorted(p.relative_to(dest).as_posix() for p in (dest / "checkpoints").rglob("*")) == [
        "checkpoints/0123abcd", "checkpoints/0123abcd/last.pt"]
    assert (dest / "checkpoints" / "0123abcd" / "last.pt").read_bytes() == b"epoch 4"
    assert not list(dest.glob(".*partial"))


def test_new_experiments_never_put_artifacts_under_the_working_folder(tmp_path, monkeypatch):
    # MLflow's own default is ./mlruns under the process's folder: a run started from a checkout
    # would write into the committed store. SQLite keeps them beside the store, another database
    # under the MLflow home, and a server decides for itself.
    monkeypatch.setenv("HMER_MLRUNS", str(tmp_path / "home"))
    assert artifact_root_for(f"sqlite:///{tmp_path / 's' / 'mlflow.db'}") == (tmp_path / "s" / "artifacts").as_uri()
    for uri in ("postgresql://hmer:pw@127.0.0.1:5432/mlflow", "postgresql+psycopg2://h@db/m", "mysql://u@h/m"):
        assert artifact_root_for(uri) == (tmp_path / "home" / "artifacts").as_uri(), uri
    assert artifact_root_for("http://127.0.0.1:5000") is None


def test_loading_a_run_s_model_leaves_no_download_behind(tmp_path, monkeypatch):
    import tempfile

    from hmer.checkpoint import atomic_torch_save, model_artifact
    from hmer.data import Vocab
    from hmer.model import build_model
    from hmer.config import Config
    from hmer.model_presets import preset_with_recipe
    from hmer.tracking.models import load_model

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    (tmp_path / "mlruns").mkdir()
    client = MlflowClient(uri)
    run_id = client.create_run(open_experiment(uri, "results")[1]).info.run_id
    cfg = Config(model=preset_with_recipe("tiny-transformer").model)
    atomic_torch_save(model_artifact(build_model(cfg.model), cfg, Vocab(), 1, 0.0), tmp_path / "model.pt")
    client.log_artifact(run_id, str(tmp_path / "model.pt"), "model")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    model, loaded, _ = load_model(run_id, uri)
    assert loaded.model == cfg.model
    assert list((tmp_path / "tmp").iterdir()) == []  # the downloaded model.pt is gone again


def _checkout(tmp_path):
    """A checkout to publish into (its project file and an empty mlruns/), and the environment
    that points the `hmer` command at it."""
    checkout = tmp_path / "checkout"
    (checkout / "mlruns").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[project]\nname = "hmer"\n')
    return checkout, {**os.environ, "HMER_MLRUNS": str(checkout / "mlruns")}


def test_publishing_a_store_whose_database_is_not_one_says_which_and_changes_nothing(tmp_path):
    work = tmp_path / "work"
    _store_with_one_run(work)  # a real mlflow.db
    (work / "mlruns" / "optuna.db").write_bytes(b"not a database")
    checkout, env = _checkout(tmp_path)
    (checkout / "mlruns" / "mlflow.db").write_bytes(b"the committed store")
    out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "publish", str(work / "mlruns")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert str(work / "mlruns" / "optuna.db") in line and "not an SQLite database" in line
    # the good mlflow.db was not published over the committed one, and no partial copy is left
    assert (checkout / "mlruns" / "mlflow.db").read_bytes() == b"the committed store"
    assert sorted(p.name for p in (checkout / "mlruns").iterdir()) == ["mlflow.db"]


_KILLED_MID_TRANSACTION = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size = 2")  # the transaction spills into the file before it commits
db.execute("BEGIN")
for i in range(50):
    db.execute("INSERT INTO tags (key, value, run_uuid) VALUES (?, hex(randomblob(2000)), ?)", (f"x{i}", sys.argv[2]))
os.kill(os.getpid(), 9)
"""


def test_a_store_whose_writer_was_killed_mid_transaction_is_copied_as_it_was_before(tmp_path):
    # A study killed with SIGKILL while MLflow wrote leaves a hot journal beside mlflow.db; the
    # copy rolls the half-written transaction back instead of failing on it.
    from hmer.tracking.portable import copy_store

    work = tmp_path / "work"
    run_id = _store_with_one_run(work)
    db = work / "mlruns" / "mlflow.db"
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_TRANSACTION, str(db), run_id])
    assert killed.returncode == -9
    assert (work / "mlruns" / "mlflow.db-journal").stat().st_size > 0  # hot: the file holds half a transaction

    copied = copy_store(work / "mlruns", tmp_path / "dest", portable=False)
    client = MlflowClient(f"sqlite:///{copied}")
    assert client.get_run(run_id).info.status == "FINISHED"
    assert not [key for key in client.get_run(run_id).data.tags if key.startswith("x")]


def test_a_superseded_study_that_stopped_unfinished_is_published_as_it_stopped_and_not_continued(tmp_path):
    # A study replaced before it finished (`hmer runs supersede`) stays in the store for reference:
    # a publish without --keep-unfinished must not drop it as if it were still training, and one
    # with it must not carry its runs' checkpoints to be continued. Superseding it closed its parent.
    from hmer.store.rename import mark_superseded
    from hmer.store.publish import unfinished_studies
    from hmer.tracking import keys

    work = tmp_path / "work"
    work.mkdir()
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri)
    running = {}
    for study in ("decoder-first", "decoder"):
        experiment = open_experiment(uri, study)[1]
        parent = client.create_run(experiment, run_name=study,  # as a study names its parent run
                                   tags={keys.STUDY: study, keys.ROLE: "study", keys.STATUS: "running"})
        running[study] = {parent.info.run_id, client.create_run(experiment, tags={keys.STUDY: study}).info.run_id}
        client.set_terminated(client.create_run(experiment, tags={keys.STUDY: study}).info.run_id, "FINISHED")
    assert unfinished_studies(client) == {"decoder-first": "running", "decoder": "running"}
    mark_superseded("decoder-first", "decoder", tracking_uri=uri)
    assert unfinished_studies(client) == {"decoder": "running"}
    assert {client.get_run(r).info.status for r in running["decoder-first"]} == {"KILLED", "RUNNING"}  # the parent

    checkout, env = _checkout(tmp_path)
    out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "publish", str(work)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "left out study decoder (running)" in out.stdout and "out study decoder-first" not in out.stdout, out.stdout
    published = MlflowClient(f"sqlite:///{checkout / 'mlruns' / 'mlflow.db'}")
    assert published.get_experiment_by_name("decoder") is None
    kept = published.get_experiment_by_name("decoder-first")
    assert kept.tags[keys.SUPERSEDED_BY] == "decoder"
    statuses = sorted(r.info.status for r in published.search_runs([kept.experiment_id]))
    assert statuses == ["FINISHED", "KILLED", "KILLED"]  # its parent closed by supersede, its dead trial by publish


# ---- a published store is clean (issue 49) -------------------------------------------------------

def test_machine_paths_are_found_where_a_value_or_word_begins_and_written_as_a_clone_reads_them(tmp_path):
    from hmer.tracking.portable import machine_paths, portable_text

    ws = tmp_path / "ws"
    for text, found, portable in [
        (f"sqlite:///{ws}/optuna.db", [f"sqlite:///{ws}/optuna.db"], "sqlite:///mlruns/optuna.db"),
        ('"path": "/data/crohme/crohme-inkml.zip"', ["/data/crohme/crohme-inkml.zip"],
         '"path": "<local>/crohme-inkml.zip"'),
        ("loaded ~/hmer/data.zip and C:\\Users\\me\\x.zip", ["~/hmer/data.zip", "C:\\Users\\me\\x.zip"],
         "loaded <local>/data.zip and <local>/x.zip"),
        ("mlruns/artifacts/x/y test_2014_exprate_mean/bi a / b 1/2/3", [], None),
        ("http://127.0.0.1:5000/#/experiments/3/runs postgresql://u:pw@db/hmer sqlite:///mlruns/mlflow.db", [], None),
    ]:
        assert machine_paths(text) == found, text
        assert portable_text(text, [ws]) == (portable or text), text


def _workspace_with_what_a_store_must_not_publish(tmp_path_factory, tmp_path):
    """A workspace copied from a real smoke study's store (its runs name the data folder, its parent
    run the Optuna storage), with what else a workspace holds: a run still RUNNING with a model.pt of
    before safetensors, a trial still RUNNING, and a finished sweep without its table."""
    import optuna

    from hmer.checkpoint import atomic_torch_save, model_artifact
    from hmer.config import Config
    from hmer.data import Vocab
    from hmer.model import build_model
    from hmer.model_presets import preset_with_recipe
    from hmer.tracking import keys
    from hmer.tracking.portable import copy_store
    from study_store import STUDY_NAME, study_store

    shared = study_store(tmp_path_factory.getbasetemp() / "report-study-store")
    work = tmp_path / "ws"
    db = copy_store(shared.root, work, portable=False)
    uri, storage = f"sqlite:///{db}", f"sqlite:///{work / 'optuna.db'}"
    client = MlflowClient(uri)
    optuna.load_study(study_name=STUDY_NAME, storage=storage).ask()  # a worker's trial, RUNNING

    experiment = open_experiment(uri, "results")[1]
    running = client.create_run(experiment, run_name="still training").info.run_id
    cfg = Config(model=preset_with_recipe("tiny-transformer").model).override(
        {"data.path": "/data/crohme/crohme-inkml.zip"})
    client.log_param(running, "data.path", cfg.data.path)
    atomic_torch_save(model_artifact(build_model(cfg.model), cfg, Vocab(), 1, 0.0), tmp_path / "model.pt")
    client.log_artifact(running, str(tmp_path / "model.pt"), "model")

    sweep = optuna.create_study(study_name="sweep-smoke", storage=storage, direction="maximize")
    sweep.set_user_attr(keys.KIND, "sweep")
    sweep.optimize(lambda trial: trial.suggest_float("train.lr", 1e-4, 1e-2, log=True) * 1000, n_trials=3)
    parent = client.create_run(open_experiment(uri, "sweep-smoke")[1], run_name="sweep-smoke", tags={
        keys.STUDY: "sweep-smoke", keys.ROLE: "study", keys.KIND: "sweep", keys.STATUS: "finished"}).info.run_id
    client.set_terminated(parent)
    return work, shared, running, parent


def test_a_published_store_names_no_machine_path_runs_nothing_and_calls_every_study_by_its_name(
        tmp_path_factory, tmp_path):
    import hashlib

    import optuna

    from hmer.store.study_run import TABLE_ARTIFACT
    from hmer.store.clean import store_problems
    from hmer.tracking import keys
    from hmer.tracking.models import load_model
    from study_store import STUDY_NAME

    work, shared, running, sweep_parent = _workspace_with_what_a_store_must_not_publish(tmp_path_factory, tmp_path)
    found = [str(p) for p in store_problems(work)]
    for expected in (f"names the machine path sqlite:///{shared.root}/optuna.db",  # the study's storage
                     f"names the machine path {shared.data_path}",  # the data of every trial (params, models)
                     "names the machine path /data/crohme/crohme-inkml.zip", f"run {running} (experiment results): "
                     "is RUNNING", f"Optuna study {STUDY_NAME} trial 2: is RUNNING"):
        assert any(expected in line for line in found), (expected, found)
    assert any(line.startswith("artifacts/") and line.endswith(f"model.safetensors: names the machine path "
                                                               f"{shared.data_path}") for line in found), found
    checkout, env = _checkout(tmp_path)
    hashes = []
    for _ in range(2):  # published twice, the same bytes: a workspace published again adds nothing to history
        out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "publish", str(work)],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        hashes.append({p.relative_to(checkout).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in (checkout / "mlruns" / "artifacts").rglob("*") if p.is_file()})
    assert hashes[0] == hashes[1]
    assert f"run {running} (still training): killed" in out.stdout, out.stdout
    published = checkout / "mlruns"
    assert store_problems(published) == []

    uri, storage = f"sqlite:///{published / 'mlflow.db'}", f"sqlite:///{published / 'optuna.db'}"
    client = MlflowClient(uri)
    parent = client.get_run(shared.parent_run_id)
    assert parent.data.params["storage"] == "sqlite:///mlruns/optuna.db"  # where a clone finds the study
    assert parent.data.params["study"] == STUDY_NAME
    trials = [r for r in client.search_runs([parent.info.experiment_id])
              if r.info.run_id != shared.parent_run_id and r.data.tags.get(keys.ROLE) != keys.ROLE_SUMMARY]
    assert {r.data.params["data.path"] for r in trials} == {f"<local>/{shared.data_path.name}"}
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    assert study.user_attrs[keys.EXPERIMENT] == STUDY_NAME
    assert study.trials[-1].state == optuna.trial.TrialState.FAIL and "published" in study.trials[-1].user_attrs[
        keys.FAILED_BY]
    closed = client.get_run(running)
    assert closed.info.status == "KILLED" and closed.data.tags[keys.STATUS] == "killed"
    model, cfg, _ = load_model(running, uri)  # the model.pt that named the data is safetensors now
    assert cfg.data.path == "<local>/crohme-inkml.zip" and list(published.rglob(f"{running}/**/model.pt")) == []
    sweep = client.get_run(sweep_parent)
    assert "sweep sweep-smoke: 3 trials (3 complete)" in sweep.data.tags[keys.MLFLOW_NOTE]
    assert TABLE_ARTIFACT in list_run_artifacts(client, sweep_parent)
    # the workspace goes on as it was
    work_client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    assert work_client.get_run(running).info.status == "RUNNING"
    assert work_client.get_run(shared.parent_run_id).data.params["storage"] == f"sqlite:///{shared.root}/optuna.db"


def test_a_store_that_cannot_be_made_clean_is_refused_in_one_line_and_the_committed_one_left_as_it_was(tmp_path):
    from hmer.tracking import keys

    work = tmp_path / "work"
    run_id = _store_with_one_run(work)
    MlflowClient(f"sqlite:///{work / 'mlruns' / 'mlflow.db'}").set_tag(run_id, keys.STUDY, "ablate_x-cpu")
    checkout, env = _checkout(tmp_path)
    (checkout / "mlruns" / "mlflow.db").write_bytes(b"the committed store")
    out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "publish", str(work / "mlruns")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert f"run {run_id} (study ablate_x-cpu): is in the experiment 'results', not 'ablate_x-cpu'" in line, line
    assert (checkout / "mlruns" / "mlflow.db").read_bytes() == b"the committed store"
    assert sorted(p.name for p in (checkout / "mlruns").iterdir()) == ["mlflow.db"]


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and not p.name.endswith(".lock")}


def _committed_store(tmp_path):
    """A checkout whose mlruns/ holds a published store of one run and one Optuna study."""
    import optuna

    work = tmp_path / "first"
    _store_with_one_run(work)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="kept", storage=f"sqlite:///{work / 'mlruns' / 'optuna.db'}").optimize(
        lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    checkout, env = _checkout(tmp_path)
    out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "publish", str(work / "mlruns")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return checkout, env


def test_a_store_that_is_not_the_committed_one_s_continuation_is_refused_and_changes_nothing(tmp_path):
    """Issue 70: publishing an unrelated store replaced every committed run with exit 0. Now it is
    refused in one line naming what it lacks, unless --replace says to put it in the store's place."""
    checkout, env = _committed_store(tmp_path)
    before = _files(checkout / "mlruns")
    foreign = tmp_path / "scratch"
    _store_with_one_run(foreign)
    cmd = [sys.executable, "-m", "hmer.cli", "runs", "publish", str(foreign / "mlruns")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "not published" in line and "1 of the 1 runs" in line and "--replace" in line
    assert _files(checkout / "mlruns") == before
    # a workspace made from the committed store is its continuation, and publishes
    ws = tmp_path / "ws"
    assert subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "workspace", str(ws)], capture_output=True,
                          env=env, cwd=tmp_path).returncode == 0
    out = subprocess.run([sys.executable, "-m", "hmer.cli", "runs", "publish", str(ws)], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # told to, the foreign store takes the committed one's place
    out = subprocess.run([*cmd, "--replace"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert _files(checkout / "mlruns") != before


def test_a_workspace_is_never_made_over_a_store_or_any_other_file(tmp_path):
    checkout, env = _committed_store(tmp_path)
    ws = tmp_path / "ws"
    cmd = [sys.executable, "-m", "hmer.cli", "runs", "workspace", str(ws)]
    assert subprocess.run(cmd, capture_output=True, env=env, cwd=tmp_path).returncode == 0
    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    progress = client.create_run(client.get_experiment_by_name("results").experiment_id)  # a workspace in use
    before = _files(ws)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert str(ws) in line and "holds a store already" in line
    assert _files(ws) == before and client.get_run(progress.info.run_id)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    out = subprocess.run([*cmd[:-1], str(tmp_path / "other")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 2 and "is not empty" in out.stderr
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]
