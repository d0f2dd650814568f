"""The extra worker processes of `--n-jobs`: each runs the same study function with role "worker".

    children = start_workers(run_grid_study, spec, budget, n_jobs, storage_url, tracking_uri, ...)

They share nothing with the main process but the Optuna storage and the MLflow store, as workers on
other machines do.
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Callable

import optuna

from .budgets import StudyBudget


def start_workers(run_study: Callable[..., Any], spec, budget: StudyBudget, n_jobs: int, storage_url: str,
                  tracking_uri: str, data_path: str | None, name: str, overrides, **options: Any):
    """The n_jobs - 1 extra worker processes (spawned: fresh interpreters, safe with torch and SQLite).

    Each runs `run_study(spec, budget, role="worker", ...)`: the caller passes its own study
    function (`run_grid_study`, `run_sweep`), so the session does not import them. `options` are
    that function's own arguments (a grid's seeds, a sweep's number of trials).
    """
    if n_jobs <= 1:
        return []
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for _ in range(n_jobs - 1):
        proc = ctx.Process(target=worker_main, args=(run_study, spec, budget), kwargs=dict(
            n_jobs=n_jobs, storage=storage_url, tracking_uri=tracking_uri, data_path=data_path,
            study_name=name, overrides=dict(overrides or {}), **options))
        proc.start()
        procs.append(proc)
    return procs


def worker_main(run_study: Callable[..., Any], spec, budget: StudyBudget, **kwargs: Any) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        run_study(spec, budget, role="worker", **kwargs)
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the group; the main one reports it
        pass
