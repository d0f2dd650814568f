"""The one place where the studies reach past Optuna's public API, and why.

Everything else in `hmer.studies` uses Optuna's public API only: studies, trials, the public
interface of `BaseSampler` (`sampler.BookedCellSampler`), and the storage object the session
creates and holds itself (`optuna.storages.RDBStorage` and its public methods; a trial's storage id
comes from them, `storage.trial_id`, not from a `FrozenTrial`'s private attribute). No other module
names a private Optuna attribute, nor patches Optuna's classes (`wrap_database_calls` gives the
project's own storage subclass its wrapped methods); this one names private methods, for the reason below, and
pyproject.toml bounds optuna from above, to the releases they were checked on (5.0):
`tests/test_servers.py` fails if a release moves them, so raise the bound after that test and
`benchmarks/optuna_queue.py` pass on the new release.

A storage that waits out a database restart (`storage.PatientRDBStorage`) must wrap every call
that reaches the database, and public Optuna reaches it through private `RDBStorage` methods too:
a study wraps its RDB storage in `_CachedStorage`, which creates trials, sets their parameters and
reads trials through these, and `optuna.storages.fail_stale_trials(study)` asks for stale trials
through `_get_stale_trial_ids` (the abstract method of the heartbeat interface `BaseHeartbeat`, so
any storage with a heartbeat has it). Unwrapped, a worker's `study.get_trials()` raised into it
while the database restarted. Optuna has no public hook for "retry storage calls on connection
errors".

What Optuna's public API offers for the rest (its queue) does not hold the studies' guarantees
(issue 50; docs/studies.md, "Several workers"), so the grid's cells are booked (`bookings.py`).
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


def private_storage_calls() -> tuple[str, ...]:
    """The private `RDBStorage` methods that public Optuna functions call and that reach the
    database, so a patient storage wraps them as well (only those this Optuna still has)."""
    return tuple(name for name in PRIVATE_STORAGE_CALLS if callable(getattr(optuna.storages.RDBStorage, name, None)))


def wrap_database_calls(subclass: type, wrap: Callable[[Callable], Callable]) -> None:
    """Give `subclass` (of `RDBStorage`) `wrap(method)` in place of every `RDBStorage` method that reads
    or writes the database: the public ones, the heartbeat's two included, and `private_storage_calls`."""
    base = optuna.storages.RDBStorage
    public = [name for name in vars(base) if not name.startswith("_") and callable(getattr(base, name))]
    for name in public + list(private_storage_calls()):
        if name not in _NOT_DATABASE_CALLS:
            setattr(subclass, name, wrap(getattr(base, name)))
