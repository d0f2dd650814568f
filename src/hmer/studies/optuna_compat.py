"""The two places where the studies need more of Optuna than its public API offers.

Everything else in `hmer.studies` uses Optuna's public API only: studies, trials, samplers, and
the storage object the session creates and holds itself (`optuna.storages.RDBStorage` and its
public methods). Both workarounds below depend on Optuna internals that have been stable since
Optuna 2.x; `tests/test_studies_claims.py` and `tests/test_servers.py` fail if a release moves
them. Checked against Optuna 5.0.
"""

from __future__ import annotations

from typing import Any, Mapping

import optuna

# 1. A storage that waits out a database restart (`storage.PatientRDBStorage`) must wrap every call
#    that reaches the database, and public Optuna reaches it through private `RDBStorage` methods
#    too: a study wraps its RDB storage in `_CachedStorage`, which creates trials, sets their
#    parameters and reads trials through these, and `optuna.storages.fail_stale_trials(study)`
#    asks for stale trials through `_get_stale_trial_ids`. Unwrapped, a worker's `study.get_trials()`
#    raised into it while the database restarted. Optuna has no public hook for "retry storage
#    calls on connection errors".
PRIVATE_STORAGE_CALLS = ("_create_new_trial", "_set_trial_param", "_get_best_trial_id", "_get_trials",
                         "_get_stale_trial_ids")


def private_storage_calls() -> tuple[str, ...]:
    """The private `RDBStorage` methods that public Optuna functions call and that reach the
    database, so a patient storage wraps them as well (only those this Optuna still has)."""
    return tuple(name for name in PRIVATE_STORAGE_CALLS if callable(getattr(optuna.storages.RDBStorage, name, None)))


# 2. `GridSampler` picks the next cell itself and has no public way to be told which cell a trial
#    takes (it also counts a FAIL cell as visited, so a killed cell would never run again). The
#    claimed cell is therefore written where GridSampler reads it: the trial's system attributes
#    "search_space" and "grid_id", the index of the cell in GridSampler's own (shuffled) list of
#    grid points. That list is private; this is the one place that reads it.
def grid_attrs(sampler: optuna.samplers.GridSampler, cell: Mapping[str, Any]) -> dict[str, Any]:
    """The trial system attributes under which `sampler` gives a trial the values of `cell`."""
    names = sampler._param_names
    grid_id = sampler._all_grids.index(tuple(cell[name] for name in names))
    return {"search_space": sampler._search_space, "grid_id": grid_id}
