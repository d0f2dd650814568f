"""One study on real servers, as on many machines: Optuna's storage on a private PostgreSQL
cluster, tracking on a real `mlflow server` with PostgreSQL behind it, and worker processes
started independently (each in a UTS namespace of its own where `unshare` works, so that
each has a host name of its own and dead workers are found by Optuna's heartbeat, as they
are across machines). Workers are SIGKILLed mid-trial and mid-checkpoint, and the
database is restarted under the running workers.

The servers come from `servers.py`; without PostgreSQL's binaries these tests skip (and
fail under HMER_REQUIRE_SERVERS=1, as in CI).
"""

from __future__ import annotations

import collections
import glob
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
import sqlalchemy.pool
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from hmer.checkpoint import load_checkpoint
from hmer.tracking import keys
from servers import PG_PASSWORD, PostgresCluster, mlflow_server, postgres_cluster
from tiny_dataset import write_dataset

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "studies" / "ablate_direction.py"
STUDY = "direction-servers"
HEARTBEAT_S = 4  # so that a worker killed on "another machine" is found 12 s after its last heartbeat
# A tiny model, short decoding, one test year; several epochs, so that a trial lasts long enough
# to be killed in the middle and writes several checkpoints.
SETTINGS = {"train.epochs": 16, "train.beam_size": 2, "train.max_decode_len": 12, "train.attention_maps": 0,
            "train.device": "cpu", "data.batch_pixels": 20_000, "data.max_batch_size": 8, "data.test_years": "2014"}

# Three directions by three seeds: enough work (each trial a few seconds) that the surviving
# worker is still training when the replacement machine has started up and books a cell.
SEEDS = 3
CELLS = 3 * SEEDS

pytestmark = pytest.mark.slow


@dataclass
class Servers:
    pg: PostgresCluster
    storage: str  # postgresql://hmer:<password>@127.0.0.1:<port>/optuna
    tracking_uri: str  # http://127.0.0.1:<port>
    root: Path
    # The test's own reader of the study, opened once. `optuna.load_study(storage=url)` on every
    # poll would build an engine each time whose pooled connections live until the garbage collector
    # finds them: on a slow machine they filled the cluster's 100 connections. Without a pool, a
    # poll holds no connection between polls and needs no revalidation after the database restart.
    reader: optuna.storages.RDBStorage


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with postgres_cluster() as pg:
        pg.create_database("optuna")
        pg.create_database("mlflow")
        root = tmp_path_factory.mktemp("servers")
        with mlflow_server(pg.url("mlflow"), root / "artifacts") as tracking_uri:
            reader = optuna.storages.RDBStorage(pg.url("optuna"),
                                                engine_kwargs={"poolclass": sqlalchemy.pool.NullPool})
            yield Servers(pg=pg, storage=pg.url("optuna"), tracking_uri=tracking_uri, root=root, reader=reader)


def _own_hostnames() -> bool:
    """Whether `unshare --uts` works here (root, or a user namespace): workers get host names."""
    try:
        return subprocess.run(["unshare", "--uts", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class Machine:
    """One worker command, started as on a machine of its own (its own host name, temp folder)."""

    def __init__(self, name: str, tmp: Path, command: list[str], hostnames: bool):
        self.name = name
        self.tmp = tmp / f"tmp-{name}"
        self.tmp.mkdir(parents=True)
        self.log_path = tmp / f"{name}.log"
        self.checkpoints = tmp / f"mlruns-{name}" / "checkpoints"  # a study's trials checkpoint there
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=str(self.tmp),
                   HMER_MLRUNS=str(tmp / f"mlruns-{name}"), HMER_CACHE=str(tmp / f"cache-{name}"),
                   HMER_STUDY_HEARTBEAT_S=str(HEARTBEAT_S))
        if hostnames:  # unshare and sh exec: the pid stays the worker's
            command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, *command]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _command(servers: Servers, data: Path) -> list[str]:
    sets = [f"{k}={v}" for k, v in SETTINGS.items()]
    return [sys.executable, str(SCRIPT), "--budget", "smoke", "--seeds", str(SEEDS), "--data", str(data),
            "--storage", servers.storage, "--tracking-uri", servers.tracking_uri, "--study-name", STUDY,
            "--set", *sets]


def _study(servers: Servers) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=STUDY, storage=servers.reader)
    except KeyError:
        return None


def _training_trial(servers: Servers, machine: Machine) -> int | None:
    """The number of a RUNNING trial of `machine` whose MLflow run has logged an epoch, or None."""
    study = _study(servers)
    if study is None:
        return None
    mine = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if (t.user_attrs.get(keys.WORKER) or {}).get("pid") == machine.proc.pid]
    if not mine:
        return None
    client = MlflowClient(servers.tracking_uri)
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`hmer.trial` = '{mine[0].number}'")
    if runs and client.get_metric_history(runs[0].info.run_id, "train_loss"):
        return mine[0].number
    return None


def _wait(predicate, machines: list[Machine], timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        for m in machines:
            if m.proc.poll() is not None:
                raise AssertionError(f"{m.name} ended (status {m.proc.returncode}) before {what}:\n{m.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def _catch_checkpoint_write(machine: Machine, timeout_s: float) -> list[str]:
    """Poll the machine's checkpoint folder until a checkpoint is half-written (atomic_torch_save's
    temporary file exists), then SIGKILL the worker at once; returns the files it left."""
    pattern = str(machine.checkpoints / "*" / ".*.pt.*.tmp")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if glob.glob(pattern):
            machine.kill()
            return glob.glob(str(machine.checkpoints / "*" / "*")) + glob.glob(str(machine.checkpoints / "*" / ".*"))
        if machine.proc.poll() is not None:
            break
        time.sleep(0.001)
    raise AssertionError(f"{machine.name} wrote no checkpoint within {timeout_s:.0f} s:\n{machine.log()[-3000:]}")


def test_workers_killed_and_a_database_restart_lose_and_repeat_nothing(servers, tmp_path):
    data = write_dataset(tmp_path / "data", {"train": 12, "2014": 4})
    hostnames = _own_hostnames()
    command = _command(servers, data)
    a, b, c = (Machine(name, tmp_path, command, hostnames) for name in ("machine-a", "machine-b", "machine-c"))
    machines, killed_b = [a, b, c], [b]
    try:
        # machine-a: killed in the middle of a trial's training.
        killed_mid_trial = _wait(lambda: _training_trial(servers, a), machines, 240, "machine-a trains a trial")
        a.kill()
        # machine-b: killed while it writes a checkpoint (the previous one must survive). A write
        # that ends between seeing its temporary file and the kill leaves none: then a replacement
        # machine is caught at its own next write.
        left = _catch_checkpoint_write(b, 240)
        while not any(p.endswith(".tmp") for p in left) and len(killed_b) < 3:
            b = Machine(f"machine-b{len(killed_b) + 1}", tmp_path, command, hostnames)
            killed_b.append(b)
            machines.append(b)
            left = _catch_checkpoint_write(b, 240)
        assert any(p.endswith(".tmp") for p in left), left
        for path in left:
            if path.endswith(".pt"):
                assert "model" in load_checkpoint(path)  # the complete checkpoints still load
        # A fresh worker joins, as a replacement machine would.
        d = Machine("machine-d", tmp_path, command, hostnames)
        machines = [c, d]
        # The database restarts under the running workers.
        # (once machine-d trains too: a worker that is still starting when the server is down is told
        # so on one line and exits, which is the bad-input case, not this one)
        _wait(lambda: _training_trial(servers, d), machines, 240, "machine-d trains a trial after the kills")
        servers.pg.stop()
        time.sleep(5)
        servers.pg.start()
        for m in machines:
            m.proc.wait(timeout=420)
    finally:
        for m in (a, *killed_b, c, *([d] if "d" in locals() else [])):
            if m.proc.poll() is None:
                m.kill()
    logs = {m.name: m.log() for m in (a, *killed_b, c, d)}
    for m in (c, d):
        assert m.proc.returncode == 0, f"{m.name}:\n{logs[m.name][-4000:]}"

    # Optuna: every cell COMPLETE exactly once, nothing RUNNING, the killed trials FAIL.
    study = _study(servers)
    trials = study.get_trials(deepcopy=False)
    complete = collections.Counter(t.user_attrs[keys.CELL_KEY] for t in trials if t.state == TrialState.COMPLETE)
    assert len(complete) == CELLS and set(complete.values()) == {1}, complete
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    killed_pids = {a.proc.pid, *(m.proc.pid for m in killed_b)}
    assert killed_mid_trial in [t.number for t in failed]
    assert {t.user_attrs[keys.WORKER]["pid"] for t in failed} == killed_pids  # nothing else failed
    assert all(t.user_attrs[keys.CELL_KEY] in complete for t in failed)  # and their cells ran again
    if hostnames:
        assert {t.user_attrs[keys.WORKER]["host"] for t in trials} <= {m.name for m in (a, *killed_b, c, d)}

    # MLflow: one parent FINISHED; a FINISHED child per cell; the killed trials' children FAILED.
    client = MlflowClient(servers.tracking_uri)
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("hmer.role") == "study"]
    children = [r for r in runs if "hmer.role" not in r.data.tags]  # the trials (summary runs aside)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    status = {int(r.data.tags["hmer.trial"]): r.info.status for r in children}
    assert sorted(n for n, s in status.items() if s == "FINISHED") == sorted(
        t.number for t in trials if t.state == TrialState.COMPLETE)
    for t in failed:
        if t.number in status:  # a worker killed before its trial's run was created has none
            assert status[t.number] == "FAILED"
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)

    # The database restart: survived, and said so on stderr, once per outage.
    restarted = "\n".join(logs[m.name] for m in (c, d))
    assert "unreachable" in restarted and "reachable again" in restarted, restarted[-4000:]

    # The password never shows up: not in any worker's output, not in MLflow params or tags.
    masked = servers.pg.url("optuna", password="***")
    assert parents[0].data.params["storage"] == masked
    assert masked in logs["machine-c"]  # the banner names the storage, masked
    for name, text in logs.items():
        assert PG_PASSWORD not in text, name
    for run in runs:
        for key, value in {**run.data.params, **run.data.tags}.items():
            assert PG_PASSWORD not in str(value), (run.info.run_id, key)

    # The final table has every cell, from `hmer report` with no study named (the latest one).
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    report = subprocess.run([sys.executable, "-m", "hmer.cli", "report", "--tracking-uri", servers.tracking_uri,
                             "--out", str(tmp_path / "report")], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=300)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"the latest study, {STUDY}" in report.stdout
    table = (tmp_path / "report" / "table.csv").read_text().splitlines()
    rows = {line.split(",")[0]: line for line in table[1:]}
    assert set(rows) == {"l2r", "r2l", "bi"}, table
    header = table[0].split(",")
    assert all(row.split(",")[header.index("seeds")] == str(SEEDS) for row in rows.values()), table
    listing = subprocess.run([sys.executable, "-m", "hmer.cli", "report", "--list", "--tracking-uri",
                              servers.tracking_uri], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert listing.returncode == 0, listing.stderr
    line = next(line for line in listing.stdout.splitlines() if STUDY in line)
    assert "finished" in line and f"{CELLS} finished, {len(failed)} failed" in line, listing.stdout


def test_a_study_whose_session_a_database_restart_left_broken_reads_on(servers):
    """A thread's database session whose connection died inside a transaction that nobody rolled
    back answers every later query with SQLAlchemy's PendingRollbackError. In CI a worker's
    `study.get_trials()` met such a session after the restart above and raised out of the worker:
    a study reads its trials through Optuna's `_CachedStorage`, which calls the storage's private
    `_get_trials`, and that call was not waited out. The patient storage now wraps it and takes the
    broken session for what it is, a lost connection: it goes on with a fresh one. The broken
    session is made here the direct way: a transaction open across a restart, its failed query
    never rolled back."""
    from sqlalchemy import exc as sa_exc
    from sqlalchemy import text

    from hmer.studies.storage import PatientRDBStorage, open_storage

    storage = open_storage(servers.storage)
    assert isinstance(storage, PatientRDBStorage)
    study = optuna.create_study(study_name="broken-session", storage=storage)
    study.enqueue_trial({"x": 1.0})
    # Optuna keeps one session per thread in `scoped_session`; the storage's calls take it from there.
    session = storage.scoped_session()
    session.execute(text("select 1"))
    servers.pg.stop()
    servers.pg.start()
    with pytest.raises(sa_exc.OperationalError):
        session.execute(text("select 1"))
    with pytest.raises(sa_exc.PendingRollbackError):
        session.execute(text("select 1"))  # the state the worker's study found
    assert storage.scoped_session() is session  # and the storage's next call gets this very session
    assert [t.state for t in study.get_trials(deepcopy=False)] == [optuna.trial.TrialState.WAITING]
    assert storage.scoped_session() is not session
