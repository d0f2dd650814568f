"""The one place where the studies reach past Optuna's public API, and why.

Elsewhere `hmer.studies` uses Optuna's public API only (a trial's storage id comes from the
storage's public methods, `storage.trial_id`); no other module names a private Optuna attribute or
patches Optuna's classes. A storage that waits out a database restart (`storage.PatientRDBStorage`)
must wrap every call that reaches the database, and public Optuna reaches it through private
`RDBStorage` methods too: a study's `_CachedStorage` creates, sets and reads trials through them, and
`fail_stale_trials` calls `_get_stale_trial_ids` (unwrapped, a worker's `study.get_trials()` raised
while the database restarted). Optuna has no public hook for retrying on connection errors.
pyproject.toml bounds optuna to the releases these were checked on (5.0): raise it once
`tests/test_servers.py` and `benchmarks/optuna_queue.py` pass on the new one.

Optuna's queue does not hold the studies' guarantees (issue 50; docs/studies.md, "Several
workers"), so the grid's cells are booked (`bookings.py`).
"""

from __future__ import annotations

from typing import Callable

import optuna

# The private `RDBStorage` methods that public Optuna functions call and that reach the database.
PRIVATE_STORAGE_CALLS = ("_create_new_trial", "_set_trial_param", "_get_best_trial_id", "_get_trials",
                         "_get_stale_trial_ids")


# The public `RDBStorage` methods that do not reach the database (or manage the connection itself).
_NOT_DATABASE_CALLS = ("upgrade", "remove_session", "get_heartbeat_interval", "get_heartbeat_stale_trial_callback",
                       "get_failed_trial_callback", "get_current_version", "get_head_version", "get_all_versions")


def wrap_database_calls(subclass: type, wrap: Callable[[Callable], Callable]) -> None:
    """Give `subclass` (of `RDBStorage`) `wrap(method)` in place of every `RDBStorage` method that reaches
    the database: the public ones (the heartbeat's included) and the `PRIVATE_STORAGE_CALLS` this Optuna
    still has."""
    base = optuna.storages.RDBStorage
    public = [name for name in vars(base) if not name.startswith("_") and callable(getattr(base, name))]
    private = [name for name in PRIVATE_STORAGE_CALLS if callable(getattr(base, name, None))]
    for name in public + private:
        if name not in _NOT_DATABASE_CALLS:
            setattr(subclass, name, wrap(getattr(base, name)))
