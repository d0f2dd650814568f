"""Optuna storage: a URL in, an `optuna.storages.RDBStorage` with Optuna's heartbeat out.

A database server may restart under running workers: every query then fails for a few seconds and the
heartbeat thread dies silently (another worker would later fail a trial still training).
`PatientRDBStorage` waits out connection errors instead, up to `outage_s`, saying so once on stderr.
Retrying is safe but for a commit whose reply was lost: then a new trial may exist twice (the spare gets
no cell; `CellBookings.reap` fails it), or a finished trial reads as failed (its cell runs again).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import optuna
from sqlalchemy import exc as sa_exc

from ..tracking.portable import sqlite_path
from ..tracking.ui import check_database
from ..tracking.store import NoStoreThere, default_tracking_uri, mask_password, mlruns_dir
from .optuna_compat import wrap_database_calls

OUTAGE_S = 600.0  # how long a worker waits for its database to come back before it gives up
HEARTBEAT_S = 20  # Optuna heartbeat of a running trial; a trial silent for GRACE_HEARTBEATS of them is stale
GRACE_HEARTBEATS = 3
HEARTBEAT_ENV = "HMER_STUDY_HEARTBEAT_S"  # another heartbeat, in whole seconds (the tests use a short one)
# PostgreSQL's answers while it restarts; opening a storage waits them out for up to RESTART_WAIT_S.
_RESTARTING = ("the database system is starting up", "the database system is shutting down")
RESTART_WAIT_S = 120.0


def default_storage(tracking_uri: str | None = None, create: bool = True) -> str:
    """SQLite `optuna.db` beside the MLflow SQLite store, else in the MLflow home; its folder made
    where `create`."""
    db = sqlite_path(tracking_uri or default_tracking_uri())
    folder = db.parent if db is not None else mlruns_dir()
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


def existing_storage(tracking_uri: str, storage: str | None = None) -> str | None:
    """The Optuna storage a command that reads a store opens: `storage`, else `optuna.db` beside the SQLite
    store `tracking_uri` where it exists, else None (opening it would create it). A local SQLite file is
    checked whole first (`tracking.ui.check_database`), and one named but missing is not created."""
    if storage is None:
        store = sqlite_path(tracking_uri)
        if store is None or not (store.parent / "optuna.db").is_file():
            return None
        storage = f"sqlite:///{store.parent / 'optuna.db'}"
    db = sqlite_path(storage)
    if db is None:
        return storage
    if not db.is_file():
        raise NoStoreThere(f"{db}: no Optuna storage there (no such file); nothing was created")
    check_database(db, "nothing was changed", role="optuna.db")
    return storage


class StaleTrials:
    """Optuna's callback for the trials its heartbeat check marks FAIL in this process, kept until `take`:
    a worker restarted after the grace period finds its dead trials already stale and must still take
    them up, as it does those whose process it finds gone. (Not a list: Optuna drops a falsy callback.)"""

    def __init__(self) -> None:
        self.failed: list[optuna.trial.FrozenTrial] = []

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.failed.append(trial)

    def take(self) -> list[optuna.trial.FrozenTrial]:
        failed, self.failed = self.failed, []
        return failed


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """An RDB storage with Optuna's heartbeat."""
    engine_kwargs: dict[str, Any] = {}
    storage_class = optuna.storages.RDBStorage
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs["connect_args"] = {"timeout": 60}  # several workers wait for each other's writes
    else:  # a database server: it may restart under running workers
        storage_class = PatientRDBStorage
        engine_kwargs["pool_pre_ping"] = True  # pooled connections from before a restart are dead
    heartbeat = heartbeat_s()
    deadline = time.monotonic() + RESTART_WAIT_S
    while True:
        try:
            with warnings.catch_warnings(), first_use_lock(url):
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat: stable since 2.9
                storage = storage_class(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat,
                                        grace_period=GRACE_HEARTBEATS * heartbeat,
                                        heartbeat_stale_trial_callback=StaleTrials())
            break
        except Exception as exc:  # noqa: BLE001 - a server that is down or refuses us: one line, no traceback
            cause = connection_error(exc)
            if cause is None:
                raise
            # Restarting: wait for it. Refusing connections: down, said at once.
            if any(state in str(cause) for state in _RESTARTING) and time.monotonic() < deadline:
                time.sleep(1.0)
                continue
            raise ValueError(f"cannot open the Optuna storage {mask_password(url)}: {first_line(cause)}") from None
    if isinstance(storage, PatientRDBStorage):
        storage.display_url = mask_password(url)
    return storage


def study_exists(storage_url: str, name: str) -> bool:
    """Whether the storage holds a study of that name (one line when its server is down)."""
    try:
        open_storage(storage_url).get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def trial_id(storage: optuna.storages.BaseStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of trial `number` of `study`."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def heartbeat_s() -> int:
    """Optuna's heartbeat interval for running trials: $HMER_STUDY_HEARTBEAT_S, else HEARTBEAT_S."""
    text = os.environ.get(HEARTBEAT_ENV, "")
    try:
        value = int(text) if text else HEARTBEAT_S
    except ValueError:
        raise ValueError(f"{HEARTBEAT_ENV}={text!r}: give whole seconds, e.g. 20") from None
    if value < 1:
        raise ValueError(f"{HEARTBEAT_ENV}={text!r}: give at least 1 second")
    return value


@contextlib.contextmanager
def first_use_lock(url: str) -> Iterator[None]:
    """Hold an exclusive lock for a local SQLite database while it is opened: the first use creates its
    tables and MLflow migrates its schema, and two processes doing that at once leave half-copied tables.
    Server databases need none: their DDL is transactional."""
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not path or path == ":memory:":
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: first use by several processes at once is not supported
        yield
        return
    # The lock lives in the temporary folder: a read-only store could not hold it.
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
    lock_path = Path(tempfile.gettempdir()) / f"hmer-first-use-{digest}.lock"
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released as the file closes
        yield


def connection_error(exc: BaseException | None) -> BaseException | None:
    """The driver error in `exc`'s chain if it says the database cannot be reached, else None.
    PendingRollbackError counts: a thread's session answers it after its connection died mid-transaction
    (CI's workers met it after a restart), and a fresh session cures it."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.PendingRollbackError)) \
                or (isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def first_line(exc: BaseException) -> str:
    """The driver's own message, one line (SQLAlchemy appends the SQL and a help link)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


class StorageUnreachable(RuntimeError):
    """The database stayed unreachable for longer than the worker waits."""


class PatientRDBStorage(optuna.storages.RDBStorage):
    """`RDBStorage` whose calls wait for an unreachable database (see the module)."""

    outage_s: float = OUTAGE_S
    display_url: str = ""  # the URL without its password, for messages

    _lock = threading.Lock()
    _down_since: float | None = None


def _patient(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: PatientRDBStorage, *args: Any, **kwargs: Any) -> Any:
        delay, deadline = 0.25, None
        while True:
            try:
                result = method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - only connection errors are waited out
                cause = connection_error(exc)
                if cause is None:
                    raise
                now = time.monotonic()
                deadline = deadline or now + self.outage_s
                with self._lock:
                    if self._down_since is None:
                        type(self)._down_since = now
                        print(f"Optuna storage {self.display_url} unreachable ({first_line(cause)}); "
                              f"waiting up to {self.outage_s:.0f} s for it", file=sys.stderr, flush=True)
                with contextlib.suppress(Exception):  # the connection is gone: closing it may fail too
                    self.remove_session()  # the next try starts a fresh session in this thread
                if now >= deadline:
                    raise StorageUnreachable(f"Optuna storage {self.display_url} unreachable for "
                                             f"{self.outage_s:.0f} s: {first_line(cause)}") from None
                time.sleep(delay)
                delay = min(2 * delay, 2.0)
                continue
            if self._down_since is not None:
                with self._lock:
                    if self._down_since is not None:
                        print(f"Optuna storage {self.display_url} reachable again after "
                              f"{time.monotonic() - self._down_since:.0f} s", file=sys.stderr, flush=True)
                        type(self)._down_since = None
            return result

    return call


wrap_database_calls(PatientRDBStorage, _patient)
