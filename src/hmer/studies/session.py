"""The study session: what every study does, grid or sweep, from the command to its table.

`run_session` runs the lifecycle (banner, data, the study and its MLflow parent run, dead workers'
trials, extra workers, trials, Ctrl-C, table); a `StudyKind` (`grid.Grid`, `sweeps.Sweep`) adds what is
its own. Bad data fail before anything is written, and a resumed study asking for something else is
refused (`open_study`). The caller presents the study in the UIs once it ends
(`hmer.store.present.present_study`, as `hmer.cli.study` and `studies/` do).

Opening a study: a new study records its kind, spec, budget, grid or space, and its base config. An
existing study is resumed under its stored base config, so every trial trains under one config whatever
changed in the code; a command asking for something else is refused before anything runs (docs/studies.md,
"Resume").
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping

import optuna

from ..config import MACHINE_KEYS, Config
from ..model_presets import Resolution
from ..tracking import keys
from ..tracking.portable import sqlite_path
from ..tracking.run import fail_runs_of_dead_processes
from ..tracking.store import (check_tracking_server, default_tracking_uri, mask_password, mlflow_client,
                              scratch_tracking_uri, store_named)
from .budgets import StudyBudget, get_budget
from .bookings import CellBookings, Worker
from .mlflow_runs import fail_dead_trial_runs, finish_parent, measured_cost, parent_run
from .resolution import study_resolution
from .spec import preset_of
from .storage import default_storage, open_storage, study_exists

POLL_S = 5.0  # how often a worker with no trial to start looks at the others' trials
# Each kind's objective in words (`keys.KIND` -> name), filled by every `StudyKind` subclass as
# `hmer.studies` imports `grid` and `sweeps`, so a study read back from a store is described by its kind.
OBJECTIVE_NAMES: dict[str, str] = {}


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
class Session:
    """One worker's handles on a study: Optuna study and storage, MLflow, the base config every cell is
    built on, and the bookings."""

    study: optuna.Study
    storage: optuna.storages.BaseStorage
    tracking_uri: str
    experiment_id: str  # the study's MLflow experiment, named as the study
    parent_run_id: str
    base: Resolution
    worker: Worker
    bookings: CellBookings
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


class StudyData:
    """One worker's data splits: given in memory, or loaded once per `DataConfig.loading_key` (a sweep trial
    may render at another height), from the rendered cache after the first time."""

    def __init__(self, given: dict[str, list] | None, say: Callable[[str], None]):
        self.given = given
        self.say = say
        self._loaded: dict[tuple, dict[str, list]] = {}

    def has(self, cfg: Config) -> bool:
        return self.given is not None or cfg.data.loading_key() in self._loaded

    def __call__(self, cfg: Config) -> dict[str, list]:
        """The splits `cfg` trains and is scored on, loaded now if not yet."""
        if self.given is not None:
            return self.given
        key = cfg.data.loading_key()
        if key not in self._loaded:
            from ..data import load_dataset

            t0 = time.monotonic()
            self._loaded[key] = load_dataset(cfg.data.path or None, cfg.data)
            sizes = ", ".join(f"{split} {len(items)}" for split, items in self._loaded[key].items())
            self.say(f"data loaded in {time.monotonic() - t0:.0f} s: {sizes}")
        return self._loaded[key]


class StudyKind:
    """What a kind of study adds to `run_session`; one object per command and process. Hooks in order:
    `plan`, `check`, `described`, `banner`, `sampler`, `pruner`, `take_up`, `done`, `open_trials`; then
    `run_next` until it has no trial left, `others_running` while it waits; `done`, `failed`, `table`."""

    name = ""  # the study's kind (keys.KIND): "grid" or "sweep"
    objective_name = ""  # what a trial's value is, in words: its name in optuna-dashboard (`open_study`)
    noun, done_word = "trials", "finished"  # "resuming: 3 of 6 trials already finished"
    print_table = True
    # Keys the spec sets beyond its fixed ones (a sweep's seed): a resumed study must keep them too.
    asked: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:  # for the studies in a store, read back by kind (`hmer.store.present`)
            OBJECTIVE_NAMES[cls.name] = cls.objective_name

    def __init__(self, spec, run_study: Callable[..., Any]):
        self.spec = spec
        self.run_study = run_study  # the module-level study function the extra workers run

    # -- before the study opens ---------------------------------------------------------------------
    def plan(self, budget: StudyBudget) -> int:
        """How many trials the study runs under `budget`."""
        raise NotImplementedError

    def check(self, base: Resolution) -> None:
        """Refuse, before anything runs, a base config that a trial's values would make invalid."""

    def described(self, base: Config) -> dict[str, Any]:
        """What the study searches, by study attribute (`keys.GRID`, ...), checked on resume."""
        raise NotImplementedError

    def banner(self, budget: StudyBudget, n_trials: int, n_jobs: int, model_preset: str, left: int) -> list[str]:
        """The banner's lines after the study's name; no expected cost when `left` is 0."""
        raise NotImplementedError

    def sampler(self) -> optuna.samplers.BaseSampler:
        raise NotImplementedError

    def pruner(self, n_trials: int) -> optuna.pruners.BasePruner:
        return optuna.pruners.NopPruner()

    def worker_options(self) -> dict[str, Any]:
        """The study function's own arguments for the extra workers."""
        return {}

    # -- once it is open ----------------------------------------------------------------------------
    def take_up(self, bookings: CellBookings, dead: list) -> str:
        """What becomes of trials whose worker died, in words."""
        raise NotImplementedError

    def done(self, bookings: CellBookings) -> int:
        """The trials that count as done."""
        raise NotImplementedError

    def open_trials(self, bookings: CellBookings) -> bool:
        """Whether a trial is left for a worker to start (it then needs the data)."""
        raise NotImplementedError

    def run_next(self, session: Session, data: StudyData) -> bool:
        """Run this worker's next trial; False when there is none for it now."""
        raise NotImplementedError

    def others_running(self, bookings: CellBookings) -> bool:
        """Whether other workers still run (or are about to run) trials of the study."""
        raise NotImplementedError

    def failed(self) -> list[str]:
        """What failed in this command, in words."""
        return []

    def table(self, session: Session, outcome: StudyOutcome) -> str:
        raise NotImplementedError


def run_session(kind: StudyKind, budget: str | StudyBudget, *, storage: str | None, tracking_uri: str | None,
                n_jobs: int | None, data_path: str | None, data: dict[str, list] | None, study_name: str | None,
                overrides: Mapping[str, Any] | None, role: str) -> StudyOutcome:
    """Run (or resume) the study `kind` describes; the arguments are `run_grid_study`'s."""
    spec = kind.spec
    budget = get_budget(budget) if isinstance(budget, str) else budget
    scratch = budget.scratch and tracking_uri is None and not store_named()  # its budget trying the pipeline
    n_jobs = max(1, n_jobs or budget.default_jobs)
    if data is not None and n_jobs > 1:
        raise ValueError("n_jobs > 1 starts worker processes that load the data themselves: give data_path")
    main = role == "main"
    uri = tracking_uri or (scratch_tracking_uri() if scratch else default_tracking_uri())
    check_tracking_server(uri)
    say = functools.partial(print, "" if main else f"[worker {os.getpid()}] ", sep="", flush=True)
    name = study_name or f"{spec.name}-{budget.name}"  # the study's, and its MLflow experiment's
    storage_url = storage or default_storage(uri)
    n_trials = kind.plan(budget)
    model_preset = preset_of(spec, budget.preset_size)
    base = study_resolution(spec, budget, n_trials=n_trials, n_jobs=n_jobs, overrides=overrides, data_path=data_path)
    kind.check(base)  # a value its key does not allow fails before any trial, not after the trials before it
    described = kind.described(base.config)
    exists = study_exists(storage_url, name)

    def banner(left: int) -> None:
        """The banner after the study's name: `kind.banner`, its storage, and how to read a scratch store."""
        lines = kind.banner(budget, n_trials, n_jobs, model_preset, left)
        lines.append(f"  Optuna storage {mask_password(storage_url)}; MLflow {mask_password(uri)}, experiment {name}")
        db = sqlite_path(uri)
        if scratch and db is not None:  # (the scratch store is a SQLite file)
            lines.append(f"  budget {budget.name} tries the pipeline in the scratch store {db.parent}, not the "
                         f"committed store (a store named by --tracking-uri or HMER_MLRUNS is used instead); read "
                         f"it with HMER_MLRUNS={db.parent} hmer report --study {name}")
        for line in lines:
            say(line)

    if main:
        say(f"study {name}: {spec.description}")
        if not exists:  # a new study: what it is and costs, before its data loads
            banner(left=n_trials)

    study_data = StudyData(data, say)
    if not study_data.has(base.config) and not exists:
        study_data(base.config)  # bad data fails here, before a study or an MLflow run exists
    store = open_storage(storage_url)
    # Asked: the keys the command sets by value (the spec's fixed ones, `kind.asked` and `--set`); the rest
    # comes from the code and may have changed since the study began.
    study, base, created = open_study(
        name, store, kind=kind.name, sampler=kind.sampler(), pruner=kind.pruner(n_trials),
        attrs={keys.SPEC: spec.name, keys.BUDGET: budget.name, keys.EXPERIMENT: name,
               keys.DESCRIPTION: spec.description, **described},
        base=base, asked=(set(spec.fixed) | set(overrides or {}) | set(kind.asked)) - set(MACHINE_KEYS),
        objective_name=kind.objective_name)
    worker = Worker.current()
    bookings = CellBookings(study, worker, store)
    dead = bookings.reap()
    what = kind.take_up(bookings, dead)
    if dead and main:
        say(f"resuming: trial(s) {', '.join(str(t.number) for t in dead)} of a dead worker marked FAIL; {what}")
    done = kind.done(bookings)
    if done and main:
        say(f"resuming: {done} of {n_trials} {kind.noun} already {kind.done_word}")
    if exists and main:  # what is done first, then what is left costs (nothing, for a study that is done)
        banner(left=n_trials - done)

    # The study's MLflow parent run, reopened unless nothing is left to run; runs of trials whose worker
    # died are marked FAILED on the way.
    known = None if created else wait_for_attr(lambda: study.user_attrs, keys.PARENT_RUN_ID, timeout_s=60.0)
    plain = {key.removeprefix(keys.PREFIX): value for key, value in described.items()}  # the parent run's names
    experiment_id, parent = parent_run(
        study, known, tracking_uri=uri, experiment=name,
        params={"study": name, "kind": kind.name, "spec": spec.name, "budget": budget.name,
                "storage": mask_password(storage_url), "n_trials": n_trials, "model_preset": model_preset,
                **{key: json.dumps(value) for key, value in plain.items()}},
        tags={keys.BUDGET: budget.name, keys.KIND: kind.name},
        artifact={"spec": spec.name, "description": spec.description, **plain, "config": base.config.to_flat_dict()},
        reopen=done < n_trials)
    if study.user_attrs.get(keys.PARENT_RUN_ID) != parent:
        study.set_user_attr(keys.PARENT_RUN_ID, parent)
    session = Session(study=study, storage=store, tracking_uri=uri, experiment_id=experiment_id,
                      parent_run_id=parent, base=base, worker=worker, bookings=bookings, budget=budget, say=say)
    session.fail_dead_trial_runs()
    fail_runs_of_dead_processes(name, uri)  # e.g. a trial's process killed with -9
    if main and done:
        cost = measured_cost(session.client, experiment_id, name)
        if cost:
            say(f"  cost {cost}")

    children: list = []  # the extra workers of n_jobs
    interrupted = False
    doing = "loading"  # what an interruption says: loading the data, a trial of this worker's, or waiting
    try:
        if not study_data.has(base.config) and kind.open_trials(bookings):
            study_data(base.config)  # once per process; the extra workers then read the warm cache
        if main:
            children = start_workers(kind.run_study, spec, budget, n_jobs, storage=storage_url, tracking_uri=uri,
                                     data_path=data_path, study_name=name, overrides=dict(overrides or {}),
                                     **kind.worker_options())
        from ..device import resolve_device, share_device  # (torch: loaded once a trial is to run)

        share_device(resolve_device(base.config.train.device), n_jobs)  # threads, and a GPU's memory
        told_waiting = False
        while True:
            doing = "trial"
            if not kind.run_next(session, study_data):
                if not main or not kind.others_running(bookings):
                    break
                if not told_waiting:
                    say("waiting: other workers run the last trials; this one ends when they do, "
                        "or takes up the trial of a worker that dies")
                    told_waiting = True
                doing = "waiting"
                time.sleep(POLL_S)  # another worker runs the last trials; if it dies they open again
            kind.take_up(bookings, bookings.reap())
            session.fail_dead_trial_runs()
    except KeyboardInterrupt:
        interrupted = True
        if doing == "loading":
            say("interrupted while loading the data: no trial had begun; run the same command to start")
        elif doing == "trial":
            say("interrupted: the trial in progress is marked FAIL; run the same command to resume it")
        elif children:
            say("interrupted while waiting: this command's other workers stop their trials (marked FAIL); "
                "run the same command to resume them")
        else:
            say("interrupted while waiting: this worker ran no trial; the other workers' trials go on")
        raise
    finally:
        for child in children:
            if interrupted:  # a SIGTERM sent to this process alone: the workers stop their trials too
                child.terminate()
            child.join()
        n_done = kind.done(bookings)
        complete = n_done >= n_trials
        failed = kind.failed()
        if main:
            session.fail_dead_trial_runs()
            finish_parent(session.client, study, parent, complete, failed, interrupted)
    outcome = StudyOutcome(study_name=name, storage=storage_url, tracking_uri=uri, experiment=name,
                           parent_run_id=parent, complete=complete, n_complete=n_done, n_expected=n_trials,
                           failed=failed)
    if main:
        outcome.table = kind.table(session, outcome)
        if kind.print_table and outcome.table:
            print(outcome.table, flush=True)
            cost = measured_cost(session.client, experiment_id, name)
            if cost:
                say(f"study {name}: cost {cost}")
    return outcome


# The study attributes a resumed study must have as the command asks, and what they are in words.
CHECKED_ATTRS = {keys.SPEC: "spec", keys.BUDGET: "budget", keys.GRID: "grid", keys.SPACE: "search space"}


def open_study(name: str, storage: optuna.storages.BaseStorage, *, kind: str, sampler: optuna.samplers.BaseSampler,
               pruner: optuna.pruners.BasePruner, attrs: Mapping[str, Any], base: Resolution,
               asked: Collection[str] = (), objective_name: str = "") -> tuple[optuna.Study, Resolution, bool]:
    """Create the study (recording `attrs`, its objective's name and the base config), or load it: the
    stored base config wins (`Resolution.take_stored`), and a command that asks for another kind, spec,
    budget or space (`attrs`) or another value of an `asked` key is refused. Returns the study, the base
    config every trial uses and whether this call created the study."""
    try:
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                                    direction="maximize")
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        created = False
    study_id = storage.get_study_id_from_name(name)
    flat = base.config.to_flat_dict()

    def record() -> None:
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        study.set_user_attr(keys.KIND, kind)
        if objective_name:
            name_objective(study, objective_name)
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
    for key, word in CHECKED_ATTRS.items():
        if key in attrs and study.user_attrs.get(key) != attrs[key]:
            raise ValueError(f"study {name!r} exists with {word} {study.user_attrs.get(key)!r}, "
                             f"but this command asks for {attrs[key]!r}; use the same options to resume "
                             f"it, or another --study-name for a new study")
    resumed = base.take_stored(stored, name)
    kept = resumed.config.to_flat_dict()
    differences = [f"{k}: study {kept.get(k)!r}, now {flat.get(k)!r}" for k in sorted(asked)
                   if kept.get(k) != flat.get(k)]
    if differences:
        raise ValueError(f"study {name!r} exists with other settings ({'; '.join(differences[:6])}); "
                         f"use the same options to resume it, or another --study-name for a new study")
    return study, resumed, False


def name_objective(study: optuna.Study, name: str) -> None:
    """`study.set_metric_names([name])` (experimental, stable since 3.2): the objective's name in
    optuna-dashboard."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([name])


def wait_for_attr(read: Callable[[], Mapping[str, Any]], key: str, timeout_s: float) -> Any:
    """A study attribute another worker is about to set; `read` reads them afresh on every call."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read().get(key)
        if value is not None or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def start_workers(run_study: Callable[..., Any], spec, budget: StudyBudget, n_jobs: int, **kwargs: Any) -> list:
    """The n_jobs - 1 extra workers (spawned interpreters, safe with torch and SQLite) sharing only the
    Optuna storage and the MLflow store, as other machines' workers do. Each runs
    `run_study(spec, budget, role="worker", n_jobs=n_jobs, **kwargs)` (the caller's study function)."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker_main, args=(run_study, spec, budget), kwargs=dict(n_jobs=n_jobs, **kwargs))
             for _ in range(n_jobs - 1)]
    for proc in procs:
        proc.start()
    return procs


def worker_main(run_study: Callable[..., Any], spec, budget: StudyBudget, **kwargs: Any) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        run_study(spec, budget, role="worker", **kwargs)
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the group; the main one reports it
        pass
