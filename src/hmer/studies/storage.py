"""An Optuna storage on a database server that waits out a restart of the server.

Workers on many machines share one PostgreSQL (or MySQL) database. When it restarts, every
query fails for a few seconds. Optuna's `RDBStorage` then raises into the worker, and worse,
its heartbeat thread dies silently: another worker later finds the trial's heartbeat stale
and fails a trial that is still training, so its cell would run a second time. Here every
storage call, the heartbeat included, waits for the database instead (up to `outage_s`),
saying so once on stderr; only errors of the connection are waited out, anything else
(a bad value, a finished trial) is raised at once.

Waiting is safe for Optuna's writes: each is one transaction, so a call that failed left
nothing behind, with one exception: a commit whose reply was lost. Retried, a new trial
may then exist twice (the spare one never gets a cell or a worker, and `CellClaims.reap`
fails it after its claim timeout), and a finished trial may report that it was already
finished (the runner treats that as a trial failed by others; its cell runs again).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any, Callable

import optuna

OUTAGE_S = 600.0  # how long a worker waits for its database to come back before it gives up


def connection_error(exc: BaseException | None) -> BaseException | None:
    """The driver error in `exc`'s chain if it says that the database cannot be reached
    (refused, shut down, connection lost), else None."""
    from sqlalchemy import exc as sa_exc

    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)):
            return exc
        if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
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
    """`optuna.storages.RDBStorage` whose calls wait for an unreachable database (see the module)."""

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


# Every call that reads or writes the database, the heartbeat's two included.
for _name in [n for n in vars(optuna.storages.RDBStorage) if not n.startswith("_")
              and callable(getattr(optuna.storages.RDBStorage, n))] + ["_get_stale_trial_ids"]:
    if _name not in ("upgrade", "remove_session", "get_heartbeat_interval", "get_heartbeat_stale_trial_callback",
                     "get_failed_trial_callback", "get_current_version", "get_head_version", "get_all_versions"):
        setattr(PatientRDBStorage, _name, _patient(getattr(optuna.storages.RDBStorage, _name)))
del _name
