"""How MLflow's web UI opens the suite's experiments: as model training, on the runs, compared.

Every experiment the suite creates carries the tag `mlflow.experimentKind` (`TRAINING_EXPERIMENT_TAGS`;
`mark_training_experiments` for an older store), and its links `workflowType=machine_learning`: MLflow
3.17.2 picks the view from the link, not the tag (docs/studies.md, "Opening a study as model training").

A study's link orders its runs by a metric (`orderByKey`, best first): the table lists every run
flat, and the charts (the first ten listed) draw the variants' summary runs first (`store.study_run`:
they alone have the metric `2014 ExpRate`).

`serve_store` (`hmer ui`) runs the two web UIs on a store, on this machine: `mlflow ui` over its MLflow
database and artifacts, optuna-dashboard over its Optuna database, both listening on `HOST` only.
Opening a store writes nothing (MLflow pinned at 3.17.2: newer releases migrate the schema;
tests/test_ui.py checks), but both UIs write what a user does in them, so a committed store
(`from_copy`) is served from a temporary copy of its databases; any other store in place, live.
`mlflow ui` runs from the store's parent folder (portable artifact locations are relative to the
checkout), its job runner off (`MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`: eight idle processes).
Each server has its own process group, so Ctrl-C reaches this process alone, which stops both
(SIGTERM, then SIGKILL after `STOP_TIMEOUT_S`) and removes the copy; `watchdog.py` does so when this
process dies (SIGKILL), so no server is left holding its port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator
from urllib.parse import quote, urlencode

from . import keys
from .portable import STORE_FILES, sqlite_path
from .watchdog import POLL_S, STOP_TIMEOUT_S

HOST = "127.0.0.1"  # both UIs listen on this machine alone
DEFAULT_PORT = 5000  # `mlflow ui`'s default
DASHBOARD_PORT = 8080  # optuna-dashboard's default
WORKFLOW_TYPE_TRAINING = "machine_learning"
# A study's link shows its variants' summary runs and its trials only: the parent run, failed trials and
# killed attempts trained again would each take one of the ten runs the charts draw. Pruned trials stay.
STUDY_COMPARISON_RUNS = (f"attributes.status != 'FAILED' and tags.`{keys.MLFLOW_PARENT_RUN_ID}` IS NOT NULL "
                         f"and tags.`{keys.TRAINED_AGAIN_IN}` IS NULL")
TRAINING_EXPERIMENT_TAGS = {keys.MLFLOW_EXPERIMENT_KIND: keys.EXPERIMENT_KIND_TRAINING}


def ui_url(experiment_id: str | None = None, *, port: int = DEFAULT_PORT, order_by: str | None = None,
           study: bool = False) -> str:
    """The `mlflow ui` link to an experiment's training runs (`study`: a study's comparison,
    `STUDY_COMPARISON_RUNS`), as charts, highest `order_by` first; without an experiment, the list of experiments."""
    query = {"workflowType": WORKFLOW_TYPE_TRAINING}
    if experiment_id is None:
        return f"http://{HOST}:{port}/#/experiments?{urlencode(query)}"
    query["compareRunsMode"] = "CHART"
    if order_by:
        query.update(orderByKey=f"metrics.`{order_by}`", orderByAsc="false")
    if study:
        query["searchFilter"] = STUDY_COMPARISON_RUNS
    return f"http://{HOST}:{port}/#/experiments/{experiment_id}/runs?{urlencode(query, quote_via=quote)}"


def run_url(experiment_id: str, run_id: str, *, port: int = DEFAULT_PORT) -> str:
    """The link that opens one run (its parameters, metrics and artifacts) in `mlflow ui`."""
    query = urlencode({"workflowType": WORKFLOW_TYPE_TRAINING})
    return f"http://{HOST}:{port}/#/experiments/{experiment_id}/runs/{run_id}?{query}"


def ui_command(tracking_uri: str, cwd: str | os.PathLike[str] | None = None) -> str:
    """The `mlflow ui` command serving `tracking_uri`, a SQLite store under the working folder by its
    relative path (`sqlite:///mlruns/mlflow.db`, as the README says)."""
    db = sqlite_path(tracking_uri)
    if db is None:
        return f"mlflow ui --backend-store-uri {tracking_uri}"
    here = Path(cwd or Path.cwd()).resolve()
    try:
        shown = db.resolve().relative_to(here).as_posix()
    except ValueError:
        shown = db.resolve().as_posix()
    return f"mlflow ui --backend-store-uri sqlite:///{shown}"


def ui_hint(tracking_uri: str, experiment_id: str, order_by: str | None = None) -> str:
    """One line for the end of a study or a report: the command and the link to its comparison."""
    return (f"compare in the MLflow UI: {ui_command(tracking_uri)}, then open "
            f"{ui_url(experiment_id, order_by=order_by, study=True)} (`hmer ui` starts it beside optuna-dashboard and "
            f"prints every study's link)")


def dashboard_url(study_id: int | None = None, *, port: int = DASHBOARD_PORT) -> str:
    """The optuna-dashboard link to a study (its storage's id), else to the list of studies."""
    base = f"http://{HOST}:{port}/dashboard/"
    return base if study_id is None else f"{base}studies/{study_id}"


def mark_training_experiments(client) -> list[str]:
    """Tag each experiment without `mlflow.experimentKind` as model training; returns their names."""
    from mlflow.entities import ViewType

    marked = []
    for experiment in client.search_experiments(view_type=ViewType.ALL):
        if keys.MLFLOW_EXPERIMENT_KIND not in experiment.tags:
            client.set_experiment_tag(experiment.experiment_id, keys.MLFLOW_EXPERIMENT_KIND,
                                      keys.EXPERIMENT_KIND_TRAINING)
            marked.append(experiment.name)
    return marked


START_TIMEOUT_S = 300.0  # `mlflow ui` takes 10-60 s to answer on a busy 2-core machine


@dataclass
class Server:
    name: str  # "mlflow ui" or "optuna-dashboard"
    ready: str  # the address that answers 200 once it serves
    process: subprocess.Popen
    log: Path


@dataclass
class ServedStore:
    """A store served by the two UIs (see `serve_store`)."""

    folder: Path  # the store
    copy: Path | None  # the temporary folder its databases were copied to, when served from a copy
    tracking_uri: str  # the MLflow database `mlflow ui` reads (the copy's, when there is one)
    storage: str | None  # the Optuna database optuna-dashboard reads; None without one
    servers: list[Server] = field(default_factory=list)  # `mlflow ui`, then optuna-dashboard where there is `storage`

    def wait(self) -> str:
        """Block until a server stops (returns its name); Ctrl-C or SIGTERM interrupts it."""
        while True:
            for server in self.servers:
                if server.process.poll() is not None:
                    return server.name
            time.sleep(POLL_S)


def executable(name: str) -> str | None:
    """`name` beside this Python (its virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


# The tables a server reads first, by database: a file without them is not a store of its kind.
SERVED_TABLES = {"mlflow.db": ("MLflow", ("alembic_version", "experiments", "runs")),
                 "optuna.db": ("Optuna", ("version_info", "studies", "trials"))}


def check_database(path: Path, then: str = "no server was started", role: str | None = None) -> None:
    """ValueError naming `path`, ending with `then`, when it is no whole SQLite database of its kind
    (`SERVED_TABLES[role or path.name]`): unreadable, truncated (quick_check need not visit the missing
    pages), damaged or without its tables; a server would stop with pages of log. Opened read-only."""
    import sqlite3

    kind, tables = SERVED_TABLES[role or path.name]
    missing_bytes = _truncated(path)
    if missing_bytes:
        raise ValueError(f"{path}: a truncated SQLite database ({missing_bytes}); {then}")
    try:
        # (the timeout: a writer's commit holds the file for a moment, and a busy store is not a damaged one)
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)) as db:
            verdict = [row[0] for row in db.execute("PRAGMA quick_check")]
            found = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        raise ValueError(f"{path}: cannot be read as an SQLite database ({exc}); {then}") from None
    if verdict != ["ok"]:
        raise ValueError(f"{path}: a damaged SQLite database ({'; '.join(verdict[:2])}); {then}")
    missing = [t for t in tables if t not in found]
    if missing:
        raise ValueError(f"{path}: not an {kind} store's database (no table {', '.join(missing)}); {then}")


def _truncated(path: Path) -> str:
    """How much of the SQLite database `path` is missing, in words, where the file is shorter than its
    header's page count (vouched for by its change counter) says; "" otherwise."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
        size = path.stat().st_size
    except OSError:
        return ""  # (sqlite3 names what is wrong with it)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00") or header[24:28] != header[92:96]:
        return ""
    page_size = int.from_bytes(header[16:18], "big")
    whole = (65536 if page_size == 1 else page_size) * int.from_bytes(header[28:32], "big")
    return f"{size:,} of its {whole:,} bytes" if size < whole else ""


def check_port(port: int, option: str) -> None:
    """ValueError when `port` is not one (1-65535) or is taken on `HOST`."""
    if not 1 <= port <= 65535:
        raise ValueError(f"{option} {port}: a port is a number from 1 to 65535")
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            raise ValueError(f"port {port} on {HOST} is in use (another server?): choose another with "
                             f"{option}") from None


@contextlib.contextmanager
def serve_store(folder: Path, *, mlflow_port: int, dashboard_port: int, from_copy: bool) -> Iterator[ServedStore]:
    """Both UIs on the store `folder`, yielded once they answer, stopped on the way out (no
    optuna-dashboard without `optuna.db` or the package). ValueError for no `mlflow.db`, a bad database,
    a bad or taken port, or no `mlflow`; RuntimeError with its log's end for a server that fails."""
    folder = Path(folder).resolve()
    if not (folder / "mlflow.db").is_file():
        raise ValueError(f"{folder} holds no MLflow store (no mlflow.db): give the store's folder with --store")
    mlflow = executable("mlflow")
    if mlflow is None:
        raise ValueError("the mlflow command is not installed here (pip install -e .)")
    check_database(folder / "mlflow.db")
    check_port(mlflow_port, "--mlflow-port")
    dashboard = executable("optuna-dashboard")
    serve_dashboard = (folder / "optuna.db").is_file() and dashboard is not None
    if serve_dashboard:
        check_database(folder / "optuna.db")
        if dashboard_port == mlflow_port:
            raise ValueError(f"--mlflow-port and --dashboard-port are both {mlflow_port}: give two ports")
        check_port(dashboard_port, "--dashboard-port")
    scratch = Path(tempfile.mkdtemp(prefix="hmer-ui-"))
    databases = folder
    if from_copy:
        databases = scratch / "store"
        databases.mkdir()
        for name in STORE_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, databases / name)
    served = ServedStore(folder=folder, copy=databases if from_copy else None,
                         tracking_uri=f"sqlite:///{databases / 'mlflow.db'}",
                         storage=f"sqlite:///{databases / 'optuna.db'}" if serve_dashboard else None)
    # The watchdogs hold the read end; the kernel closes the write end however this process ends.
    watched, alive = os.pipe()
    try:
        served.servers.append(_start(
            "mlflow ui", [mlflow, "ui", "--backend-store-uri", served.tracking_uri, "--host", HOST,
                          "--port", str(mlflow_port), "--workers", "1"],
            port=mlflow_port, ready="/health", log=scratch / "mlflow-ui.log", cwd=folder.parent, watched=watched,
            env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}))
        if serve_dashboard:
            served.servers.append(_start(
                "optuna-dashboard",
                [str(dashboard), str(served.storage), "--host", HOST, "--port", str(dashboard_port)],
                port=dashboard_port, ready="/dashboard/", log=scratch / "optuna-dashboard.log", cwd=folder.parent,
                watched=watched))
        _wait_until_ready(served.servers)
        yield served
    finally:
        for server in served.servers:
            _stop(server.process)
        os.close(watched)
        os.close(alive)
        shutil.rmtree(scratch, ignore_errors=True)


WATCHDOG = Path(__file__).with_name("watchdog.py")


def _start(name: str, cmd: list[str], *, port: int, ready: str, log: Path, cwd: Path, watched: int,
           env: dict[str, str] | None = None) -> Server:
    """`cmd` started under its watchdog (the pipe's read end `watched`), the leader of a group of its own."""
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, str(WATCHDOG), str(watched), str(log.parent), "--", *cmd],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                   env={**os.environ, **(env or {})}, pass_fds=(watched,))
    return Server(name=name, ready=f"http://{HOST}:{port}{ready}", process=process, log=log)


def _wait_until_ready(servers: list[Server]) -> None:
    waiting = list(servers)
    deadline = time.monotonic() + START_TIMEOUT_S
    while waiting:
        for server in list(waiting):
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(server.ready, timeout=2) as response:
                    if response.status == 200:
                        waiting.remove(server)
                        continue
            if server.process.poll() is not None or time.monotonic() > deadline:
                lines = server.log.read_text(errors="replace").strip().splitlines()
                what = (f"stopped with status {server.process.returncode}" if server.process.poll() is not None
                        else f"did not answer within {START_TIMEOUT_S:.0f} s")
                raise RuntimeError(f"{server.name} {what}; the end of its log:\n" + "\n".join(lines[-15:]))
        if waiting:
            time.sleep(POLL_S)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (with its uvicorn or gunicorn workers), SIGKILL to what is
    left after `STOP_TIMEOUT_S`."""
    group = process.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    with contextlib.suppress(ProcessLookupError):  # (signal 0 to a group that is gone: it is stopped)
        while time.monotonic() < deadline:
            os.killpg(group, 0)
            process.poll()  # reap the leader, so that it does not count as alive
            time.sleep(0.1)
        os.killpg(group, signal.SIGKILL)
    process.wait()
