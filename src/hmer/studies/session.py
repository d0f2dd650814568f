"""The study session: one worker's handles on a study, opened the same way by grids and sweeps.

    setup = resolve(spec.name, budget, ...)          # budget, workers, names, storage URL
    storage = open_storage(setup.storage_url)        # held by the session: see storage.py
    study, base, created = open_study(setup, storage, kind="grid", sampler=..., attrs=..., base=...)
    session = open_session(setup, storage, study, base, created, Worker.current(), params=..., tags=...,
                           artifact=...)

Opening a study creates it (recording its options and the base config every cell starts from)
or loads it and refuses other options, so that every trial of a study trains under one config.
Opening the session creates or reopens the study's MLflow parent run and marks FAILED the runs
of trials whose worker died. The extra worker processes of `n_jobs` run the same study function,
which the grid or sweep passes to `start_workers`, with role "worker".
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import optuna

from ..config import Config
from ..tracking import keys
from ..tracking.store import mlflow_client
from .budgets import StudyBudget, get_budget
from .claims import Worker
from .mlflow_runs import fail_dead_trial_runs, parent_run
from .storage import default_storage

POLL_S = 5.0  # how often a worker with nothing to claim looks at the others' trials
# Keys that may differ between the workers of one study: where the data is, how long to train
# (derived from the number of workers), how far ahead batches are loaded, and the encoder's memory
# layout (its default changed after committed studies had begun). A resumed study runs with its
# stored values of all but data.path and data.prefetch (open_study), so none changes what it trains.
MAY_DIFFER = ("data.path", "train.time_budget_s", "data.prefetch", "train.channels_last")


@dataclass
class StudyOutcome:
    """What a study run leaves behind, for the caller and the tests."""

    study_name: str
    storage: str
    tracking_uri: str
    experiment: str
    parent_run_id: str
    complete: bool
    n_complete: int
    n_expected: int
    failed: list[str] = field(default_factory=list)  # cells or trials that failed in this run
    table: str = ""


@dataclass
class Setup:
    """What a grid study and a sweep resolve the same way before opening their study."""

    budget: StudyBudget
    n_jobs: int
    name: str  # the study's, and its MLflow experiment's
    main: bool
    say: Callable[[str], None]
    tracking_uri: str
    storage_url: str


@dataclass
class Session:
    """One worker's handles on a study: the Optuna study and its storage, MLflow, the base config."""

    study: optuna.Study
    storage: optuna.storages.BaseStorage
    storage_url: str
    tracking_uri: str
    experiment: str
    experiment_id: str
    parent_run_id: str
    base: Config
    created: bool
    worker: Worker
    budget: StudyBudget
    say: Callable[[str], None]

    @property
    def client(self):
        return mlflow_client(self.tracking_uri)

    @property
    def name(self) -> str:
        return self.study.study_name

    def fail_dead_trial_runs(self) -> list[str]:
        return fail_dead_trial_runs(self.client, self.experiment_id, self.study)


def resolve(spec_name: str, budget: str | StudyBudget, *, n_jobs: int | None, data, study_name: str | None,
            role: str, tracking_uri: str | None, storage: str | None) -> Setup:
    from ..tracking.store import check_tracking_server, default_tracking_uri

    budget = get_budget(budget) if isinstance(budget, str) else budget
    n_jobs = max(1, n_jobs or budget.default_jobs)
    if data is not None and n_jobs > 1:
        raise ValueError("n_jobs > 1 starts worker processes that load the data themselves: give data_path")
    main = role == "main"
    tracking_uri = tracking_uri or default_tracking_uri()
    check_tracking_server(tracking_uri)
    return Setup(budget=budget, n_jobs=n_jobs, name=study_name or f"{spec_name}-{budget.name}", main=main,
                 say=printer("" if main else f"[worker {os.getpid()}] "), tracking_uri=tracking_uri,
                 storage_url=storage or default_storage(tracking_uri))


def open_study(setup: Setup, storage: optuna.storages.BaseStorage, *, kind: str, sampler, pruner,
               attrs: Mapping[str, Any], base: Config) -> tuple[optuna.Study, Config, bool]:
    """Create the study (recording `attrs` and the base config), or load it and check it matches.

    Returns the study, the base config every cell uses (the stored one on resume) and
    whether this call created the study.
    """
    name = setup.name
    try:
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                                    direction="maximize")
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        created = False
    study_id = storage.get_study_id_from_name(name)
    flat = base.to_flat_dict()

    def record() -> None:
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        study.set_user_attr(keys.KIND, kind)
        storage.set_study_system_attr(study_id, keys.CONFIG, flat)

    if created:
        record()
        return study, base, True
    stored = wait_for_attr(lambda: storage.get_study_system_attrs(study_id), keys.CONFIG, timeout_s=60.0)
    if stored is None:  # its creator died before recording it: this worker records it now
        record()
        return study, base, False
    if study.user_attrs.get(keys.KIND, kind) != kind:
        raise ValueError(f"study {name!r} is a {study.user_attrs[keys.KIND]} study, not a {kind}; "
                         f"choose another --study-name")
    for key in (keys.GRID, keys.SPACE, keys.SPEC):
        if key in attrs and study.user_attrs.get(key) != attrs[key]:
            raise ValueError(f"study {name!r} exists with {key} = {study.user_attrs.get(key)!r}, "
                             f"but this command asks for {attrs[key]!r}; use the same options to resume "
                             f"it, or another --study-name for a new study")
    # A key the stored config lacks was added to the suite after the study began: the study keeps
    # the value it ran with (config.VALUES_BEFORE_KEY_EXISTED), so it is not a difference.
    differences = [f"{k}: study {stored.get(k)!r}, now {flat.get(k)!r}" for k in sorted(stored)
                   if k not in MAY_DIFFER and stored.get(k) != flat.get(k)]
    if differences:
        raise ValueError(f"study {name!r} exists with another base config ({'; '.join(differences[:6])}); "
                         f"use the same options to resume it, or another --study-name for a new study")
    resumed = Config.from_flat_dict(dict(stored), stored=True).override(
        {"data.path": flat["data.path"], "data.prefetch": flat["data.prefetch"]})
    return study, resumed, False


def wait_for_attr(read: Callable[[], Mapping[str, Any]], key: str, timeout_s: float) -> Any:
    """A study attribute that its creator (another worker) is about to set; `read` reads the
    attributes from the storage, afresh on every call."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read().get(key)
        if value is not None or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def open_session(setup: Setup, storage: optuna.storages.BaseStorage, study: optuna.Study, base: Config,
                 created: bool, worker: Worker, *, params: Mapping[str, Any], tags: Mapping[str, str],
                 artifact: Mapping[str, Any], reopen: bool = True) -> Session:
    """The study's MLflow parent run (created, or reopened unless `reopen` is False: nothing is left
    to run) and this worker's session; MLflow runs of trials whose worker died are marked FAILED on
    the way."""
    known = None if created else wait_for_attr(lambda: study.user_attrs, keys.PARENT_RUN_ID, timeout_s=60.0)
    experiment_id, parent = parent_run(study, known, tracking_uri=setup.tracking_uri, experiment=setup.name,
                                       params=params, tags=tags, artifact=artifact, reopen=reopen)
    if study.user_attrs.get(keys.PARENT_RUN_ID) != parent:
        study.set_user_attr(keys.PARENT_RUN_ID, parent)
    session = Session(study=study, storage=storage, storage_url=setup.storage_url, tracking_uri=setup.tracking_uri,
                      experiment=setup.name, experiment_id=experiment_id, parent_run_id=parent, base=base,
                      created=created, worker=worker, budget=setup.budget, say=setup.say)
    session.fail_dead_trial_runs()
    from ..tracking.run import fail_runs_of_dead_processes

    fail_runs_of_dead_processes(setup.tracking_uri)  # e.g. a `hmer train` of this machine killed with -9
    return session


# ---- base config and data ---------------------------------------------------------------------

def base_config(model_preset: str, budget: StudyBudget, n_trials: int, n_jobs: int,
                fixed: Mapping[str, Any], overrides: Mapping[str, Any] | None, data_path: str | None) -> Config:
    """The config every cell starts from: model preset + its recipe, study budget, spec, user."""
    from ..presets import preset_with_recipe

    cfg = preset_with_recipe(model_preset)
    cfg = cfg.override(budget.config_overrides(n_trials, n_jobs)).override(dict(fixed))
    values = dict(overrides or {})
    if data_path:
        values["data.path"] = str(data_path)
    return cfg.override(values).validate()


def load_data(cfg: Config, say: Callable[[str], None]) -> dict[str, list]:
    from ..data import load_dataset

    t0 = time.monotonic()
    data = load_dataset(cfg.data.path or None, cfg.data)
    sizes = ", ".join(f"{split} {len(items)}" for split, items in data.items())
    say(f"data loaded in {time.monotonic() - t0:.0f} s: {sizes}")
    return data


def set_threads(n_jobs: int) -> None:
    """Divide this machine's cores between the worker processes (unless OMP_NUM_THREADS says)."""
    if n_jobs <= 1 or os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // n_jobs))


def printer(prefix: str) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(f"{prefix}{message}", flush=True)
    return say


# ---- the extra worker processes ----------------------------------------------------------------

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
