"""Run a study: a grid ablation or a TPE sweep, every trial a real training run.

    outcome = run_grid_study(DIRECTION, "smoke")          # python studies/ablate_direction.py
    outcome = run_sweep(SWEEP, "short", n_jobs=3)         # python studies/sweep.py

One study is one Optuna study (SQLite beside the MLflow store unless `storage` names any
RDB URL) and one MLflow parent run (tags `hmer.study=<name>`, `hmer.role=study`; params:
the study name, preset, grid and storage). Every trial is one child run made by
`hmer.training.train`, tagged with the trial number, the grid cell, the seed and the
variant; the trial's user attributes get the run id and the test scores.

Running the same command again resumes the study: trials left RUNNING by a dead worker
are marked FAIL (their MLflow runs FAILED), and their cells run again; COMPLETE cells
never run twice, also not with several workers (see `hmer.studies.claims`). `n_jobs`
starts that many worker processes on this machine; the same command on other machines
with the same `--storage` adds more.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..config import Config
from ..tracking.store import mask_password
from .claims import ERROR_ATTR, WORKER_ATTR, CellClaims, ClaimedGridSampler, Worker, describe_cell_key
from .presets import StudyPreset, get_preset
from .spec import SEED_KEY, StudySpec, SweepSpec, cell_key, cell_label, variant_label

PARENT_ATTR = "hmer.parent_run_id"  # study user attribute: the MLflow parent run
CONFIG_ATTR = "hmer.config"  # study system attribute: the base config of every cell (flat dict)
HEARTBEAT_S = 20  # Optuna heartbeat of a running trial; a trial silent for 3 heartbeats is stale
HEARTBEAT_ENV = "HMER_STUDY_HEARTBEAT_S"  # another heartbeat, in whole seconds (the tests use a short one)
POLL_S = 5.0  # how often a worker with nothing to claim looks at the others' trials
# Keys that may differ between the workers of one study: where the data is, how long to train
# (derived from the number of workers) and the device string.
_MAY_DIFFER = ("data.path", "train.time_budget_s", "data.prefetch")


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


# ---- storage and MLflow ---------------------------------------------------------------------

def default_storage(tracking_uri: str | None = None) -> str:
    """SQLite `optuna.db` beside the MLflow SQLite store, else in the MLflow home."""
    from ..tracking.store import default_tracking_uri, mlruns_dir

    uri = tracking_uri or default_tracking_uri()
    if uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):]).parent
    else:
        folder = mlruns_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


# PostgreSQL's answers while it restarts; opening a storage waits them out for up to RESTART_WAIT_S.
_RESTARTING = ("the database system is starting up", "the database system is shutting down")
RESTART_WAIT_S = 120.0


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """An RDB storage with Optuna's heartbeat (so trials of dead workers on other hosts go FAIL)."""
    from .storage import PatientRDBStorage, connection_error, first_line

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
            with warnings.catch_warnings(), _first_use_lock(url):
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat: stable since 2.9
                storage = storage_class(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat,
                                        grace_period=3 * heartbeat)
            break
        except Exception as exc:  # noqa: BLE001 - a server that is down or refuses us: one line, no traceback
            cause = connection_error(exc)
            if cause is None:
                raise
            # A server that says it is starting or shutting down is restarting: wait for it. One that
            # refuses connections is down, and the user hears so at once.
            if any(state in str(cause) for state in _RESTARTING) and time.monotonic() < deadline:
                time.sleep(1.0)
                continue
            raise ValueError(f"cannot open the Optuna storage {mask_url(url)}: {first_line(cause)}") from None
    if isinstance(storage, PatientRDBStorage):
        storage.display_url = mask_url(url)
    return storage


def study_exists(storage_url: str, name: str) -> bool:
    """Whether the storage holds a study of that name (opening the storage, and failing on
    one line when its server is down)."""
    try:
        open_storage(storage_url).get_study_id_from_name(name)
    except KeyError:
        return False
    return True


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
def _first_use_lock(url: str) -> Iterator[None]:
    """Hold an exclusive lock beside a local SQLite database while it is opened.

    The first use of a new database creates its tables, and MLflow then runs its schema
    migrations; two processes doing that at once break each other (SQLite's batch
    migrations leave half-copied tables behind). Workers on one machine therefore take
    turns here. Server databases (PostgreSQL, MySQL) need no lock: their DDL is transactional.
    """
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not path or path == ":memory:":
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: first use by several processes at once is not supported
        yield
        return
    lock_path = Path(path).with_name(Path(path).name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def mask_url(url: str) -> str:
    """A storage URL without its password, for params and printing."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not an SQLAlchemy URL: print as given
        return url


def _mlflow_client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _study_runs_filter(study_name: str) -> str:
    quoted = study_name.replace("'", "\\'")
    return f"tags.`hmer.study` = '{quoted}'"


def fail_dead_trial_runs(client, experiment_id: str, study: optuna.Study) -> list[str]:
    """Mark FAILED the MLflow runs of trials that Optuna has marked FAIL but MLflow has not.

    That is a trial whose worker died: while training (the run is left RUNNING), or in
    the moment between train() ending its run and Optuna recording the trial (the run is
    FINISHED, but the cell runs again, so this run must not count twice in a table).
    train() itself ends its run FAILED on every exception it sees. Returns the run ids marked.
    """
    runs = client.search_runs([experiment_id], filter_string=_study_runs_filter(study.study_name),
                              max_results=10_000)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    marked = []
    for run in runs:
        number = run.data.tags.get("hmer.trial")
        if number is None or run.info.status in ("FAILED", "KILLED"):
            continue  # the parent run, or already ended as failed / pruned
        if states.get(int(number)) != TrialState.FAIL:
            continue  # running, complete or pruned: MLflow agrees
        was = run.info.status
        client.set_tag(run.info.run_id, "hmer.status", "failed")
        client.set_tag(run.info.run_id, "hmer.error", f"the worker of trial {number} died (run {was.lower()}); "
                                                      f"the trial is FAIL in Optuna and its cell runs again")
        client.set_terminated(run.info.run_id, status="FAILED")
        marked.append(run.info.run_id)
    return marked


# ---- the study and its parent run -------------------------------------------------------------

@dataclass
class _Session:
    """One worker's handles on a study: the Optuna study, MLflow and the base config."""

    study: optuna.Study
    storage_url: str
    tracking_uri: str
    experiment: str
    experiment_id: str
    parent_run_id: str
    base: Config
    created: bool
    worker: Worker
    say: Callable[[str], None]

    @property
    def client(self):
        return _mlflow_client(self.tracking_uri)


@dataclass
class _Setup:
    """What a grid study and a sweep resolve the same way before opening their study."""

    preset: StudyPreset
    n_jobs: int
    name: str  # the study's, and its MLflow experiment's
    main: bool
    say: Callable[[str], None]
    tracking_uri: str
    storage_url: str


def _setup(spec_name: str, preset: str | StudyPreset, *, n_jobs: int | None, data, study_name: str | None,
           role: str, tracking_uri: str | None, storage: str | None) -> _Setup:
    from ..tracking.store import check_tracking_server, default_tracking_uri

    preset = get_preset(preset) if isinstance(preset, str) else preset
    n_jobs = max(1, n_jobs or preset.default_jobs)
    if data is not None and n_jobs > 1:
        raise ValueError("n_jobs > 1 starts worker processes that load the data themselves: give data_path")
    main = role == "main"
    tracking_uri = tracking_uri or default_tracking_uri()
    check_tracking_server(tracking_uri)
    return _Setup(preset=preset, n_jobs=n_jobs, name=study_name or f"{spec_name}-{preset.name}", main=main,
                  say=_printer("" if main else f"[worker {os.getpid()}] "), tracking_uri=tracking_uri,
                  storage_url=storage or default_storage(tracking_uri))


def _open_session(setup: _Setup, study: optuna.Study, base: Config, created: bool, worker: Worker, *,
                  params: Mapping[str, Any], tags: Mapping[str, str], artifact: Mapping[str, Any]) -> _Session:
    """The study's MLflow parent run (created or reopened) and this worker's session; MLflow runs
    of trials whose worker died are marked FAILED on the way."""
    experiment_id, parent = _parent_run(study, created=created, tracking_uri=setup.tracking_uri,
                                        experiment=setup.name, params=params, tags=tags, artifact=artifact)
    session = _Session(study=study, storage_url=setup.storage_url, tracking_uri=setup.tracking_uri,
                       experiment=setup.name, experiment_id=experiment_id, parent_run_id=parent, base=base,
                       created=created, worker=worker, say=setup.say)
    fail_dead_trial_runs(session.client, experiment_id, study)
    return session


def _open_study(*, name: str, kind: str, storage_url: str, sampler, pruner, attrs: Mapping[str, Any],
                base: Config) -> tuple[optuna.Study, Config, bool]:
    """Create the study (recording `attrs` and the base config), or load it and check it matches.

    Returns the study, the base config every cell uses (the stored one on resume) and
    whether this call created the study.
    """
    storage = open_storage(storage_url)
    try:
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                                    direction="maximize")
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        created = False
    flat = base.to_flat_dict()
    if created:
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        study.set_user_attr("hmer.kind", kind)
        _set_system_attr(study, CONFIG_ATTR, flat)
        return study, base, True
    stored = _wait_for_attr(study, CONFIG_ATTR, timeout_s=60.0, system=True)
    if stored is None:  # its creator died before recording it: this worker records it now
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        study.set_user_attr("hmer.kind", kind)
        _set_system_attr(study, CONFIG_ATTR, flat)
        return study, base, False
    if study.user_attrs.get("hmer.kind", kind) != kind:
        raise ValueError(f"study {name!r} is a {study.user_attrs['hmer.kind']} study, not a {kind}; "
                         f"choose another --study-name")
    for key in ("hmer.grid", "hmer.space", "hmer.spec"):
        if key in attrs and study.user_attrs.get(key) != attrs[key]:
            raise ValueError(f"study {name!r} exists with {key} = {study.user_attrs.get(key)!r}, "
                             f"but this command asks for {attrs[key]!r}; use the same options to resume "
                             f"it, or another --study-name for a new study")
    # A key the stored config lacks was added to the suite after the study began: the study keeps
    # the value it ran with (config.VALUES_BEFORE_KEY_EXISTED), so it is not a difference.
    differences = [f"{k}: study {stored.get(k)!r}, now {flat.get(k)!r}" for k in sorted(stored)
                   if k not in _MAY_DIFFER and stored.get(k) != flat.get(k)]
    if differences:
        raise ValueError(f"study {name!r} exists with another base config ({'; '.join(differences[:6])}); "
                         f"use the same options to resume it, or another --study-name for a new study")
    resumed = Config.from_flat_dict(dict(stored), stored=True).override(
        {"data.path": flat["data.path"], "data.prefetch": flat["data.prefetch"]})
    return study, resumed, False


def _set_system_attr(study: optuna.Study, key: str, value: Any) -> None:
    study._storage.set_study_system_attr(study._study_id, key, value)


def _wait_for_attr(study: optuna.Study, key: str, timeout_s: float, system: bool = False) -> Any:
    """A study attribute that its creator (another worker) is about to set."""
    deadline = time.monotonic() + timeout_s
    while True:
        attrs = study._storage.get_study_system_attrs(study._study_id) if system else study.user_attrs
        value = attrs.get(key)  # read from the storage every time
        if value is not None or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def _parent_run(study: optuna.Study, *, created: bool, tracking_uri: str, experiment: str, params: Mapping[str, Any],
                tags: Mapping[str, str], artifact: Mapping[str, Any]) -> tuple[str, str]:
    """The study's MLflow parent run, created once and reopened on resume: (experiment id, run id)."""
    from ..tracking.store import setup_mlflow

    with _first_use_lock(tracking_uri):  # MLflow's first use of a new store migrates its schema
        experiment_id = setup_mlflow(tracking_uri, experiment)
    client = _mlflow_client(tracking_uri)
    run_id = None if created else _wait_for_attr(study, PARENT_ATTR, timeout_s=60.0)
    if run_id is not None:
        try:
            client.get_run(run_id)
        except Exception:  # noqa: BLE001 - recorded in another MLflow store
            run_id = None
    if run_id is None:
        found = client.search_runs([experiment_id], filter_string=(
            f"{_study_runs_filter(study.study_name)} and tags.`hmer.role` = 'study'"),
            order_by=["attributes.start_time ASC"], max_results=1)
        run_id = found[0].info.run_id if found else None
    if run_id is None:
        run = client.create_run(experiment_id, run_name=study.study_name,
                                tags={"hmer.study": study.study_name, "hmer.role": "study",
                                      "hmer.status": "running", **tags})
        run_id = run.info.run_id
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            client.log_batch(run_id, params=items[i:i + 100])
        client.log_text(run_id, json.dumps(artifact, indent=2, sort_keys=True, default=str), "study.json")
    else:
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, "hmer.status", "running")
    if study.user_attrs.get(PARENT_ATTR) != run_id:
        study.set_user_attr(PARENT_ATTR, run_id)
    return experiment_id, run_id


def _finish_parent(session: _Session, complete: bool, failed: Sequence[str], interrupted: bool) -> None:
    """FINISHED when the study is complete; FAILED/KILLED when it stops short and no one else runs it."""
    client = session.client
    running = session.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if complete:
        client.set_tag(session.parent_run_id, "hmer.status", "finished")
        client.set_terminated(session.parent_run_id, status="FINISHED")
    elif not running:
        client.set_tag(session.parent_run_id, "hmer.status", "interrupted" if interrupted else "incomplete")
        if failed:
            client.set_tag(session.parent_run_id, "hmer.failed", "; ".join(failed)[:5000])
        client.set_terminated(session.parent_run_id, status="KILLED" if interrupted else "FAILED")


# ---- base config and data ---------------------------------------------------------------------

def base_config(model_preset: str, preset: StudyPreset, n_trials: int, n_jobs: int,
                fixed: Mapping[str, Any], overrides: Mapping[str, Any] | None, data_path: str | None) -> Config:
    """The config every cell starts from: model preset + its recipe, study preset, spec, user."""
    from ..presets import experiment_config

    cfg = experiment_config(model_preset)
    cfg = cfg.override(preset.config_overrides(n_trials, n_jobs)).override(dict(fixed))
    values = dict(overrides or {})
    if data_path:
        values["data.path"] = str(data_path)
    return cfg.override(values).validate()


def _load_data(cfg: Config, say: Callable[[str], None]) -> dict[str, list]:
    from ..data import load_dataset

    t0 = time.monotonic()
    data = load_dataset(cfg.data.path or None, cfg.data)
    sizes = ", ".join(f"{split} {len(items)}" for split, items in data.items())
    say(f"data loaded in {time.monotonic() - t0:.0f} s: {sizes}")
    return data


def _set_threads(n_jobs: int) -> None:
    """Divide this machine's cores between the worker processes (unless OMP_NUM_THREADS says)."""
    if n_jobs <= 1 or os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // n_jobs))


def _printer(prefix: str) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(f"{prefix}{message}", flush=True)
    return say


# ---- grid studies -------------------------------------------------------------------------------

def run_grid_study(
    spec: StudySpec,
    preset: str | StudyPreset = "smoke",
    *,
    storage: str | None = None,
    tracking_uri: str | None = None,
    n_jobs: int | None = None,
    data_path: str | None = None,
    data: dict[str, list] | None = None,
    study_name: str | None = None,
    seeds: Sequence[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    print_table: bool = True,
    role: str = "main",
) -> StudyOutcome:
    """Run (or resume) the grid study `spec` under `preset` until every cell is COMPLETE.

    Args:
        spec: the grid (see `hmer.studies.spec`).
        preset: smoke, short or paper, or a StudyPreset.
        storage: an RDB URL shared by every worker; default SQLite beside the MLflow store.
        tracking_uri: the MLflow store; default `hmer.tracking.default_tracking_uri()`.
        n_jobs: worker processes on this machine (default: the preset's); each loads the data.
        data_path: the dataset (folder or zip); default the usual search (`hmer.data`).
        data: already-loaded splits, for a single worker (tests); overrides `data_path`.
        study_name: default "<spec name>-<preset>".
        seeds: the seed axis; default the preset's.
        overrides: Config overrides held equal in every cell (`--set`).
        print_table: print the per-year table at the end.
        role: "main" prints the banner and the table and waits for the other workers;
            "worker" (the extra processes of n_jobs) only runs trials.
    """
    setup = _setup(spec.name, preset, n_jobs=n_jobs, data=data, study_name=study_name, role=role,
                   tracking_uri=tracking_uri, storage=storage)
    preset, n_jobs, name, main, say = setup.preset, setup.n_jobs, setup.name, setup.main, setup.say
    tracking_uri, storage_url = setup.tracking_uri, setup.storage_url
    seeds = tuple(int(s) for s in (seeds or preset.seeds))
    cells = spec.cells(seeds)
    space = spec.search_space(seeds)
    base = base_config(spec.model_preset(preset.model_size), preset, len(cells), n_jobs, spec.fixed, overrides,
                       data_path)
    if main:
        say(f"study {name}: {spec.description}")
        say(preset.describe(len(cells), n_jobs))
        say(f"  grid: {', '.join(f'{k} in {list(v)}' for k, v in space.items())} = {len(cells)} trials "
            f"({len(seeds)} seed{'s' if len(seeds) > 1 else ''} per variant); baseline "
            f"{cell_label(spec.baseline_cell)}; model preset {spec.model_preset(preset.model_size)}")
        say(f"  Optuna storage {mask_url(storage_url)}; MLflow {mask_password(tracking_uri)}, experiment {name}")

    if data is None and not study_exists(storage_url, name):
        data = _load_data(base, say)  # bad data fails here, before a study or an MLflow run exists
    sampler = ClaimedGridSampler(space)
    attrs = {"hmer.spec": spec.name, "hmer.preset": preset.name, "hmer.grid": space,
             "hmer.baseline": spec.baseline_cell, "hmer.experiment": name}
    study, base, created = _open_study(name=name, kind="grid", storage_url=storage_url, sampler=sampler,
                                       pruner=optuna.pruners.NopPruner(), attrs=attrs, base=base)
    worker = Worker.current()
    claims = CellClaims(study, worker)
    reaped = claims.reap()
    if reaped and main:
        say(f"resuming: trial(s) {', '.join(str(t.number) for t in reaped)} of a dead worker marked FAIL; "
            f"their cells run again")
    status = claims.status()
    done = sum(cell_key(c) in status.complete for c in cells)
    if done and main:
        say(f"resuming: {done} of {len(cells)} cells already complete")
    session = _open_session(
        setup, study, base, created, worker,
        params={"study": name, "kind": "grid", "spec": spec.name, "preset": preset.name,
                "grid": json.dumps(space), "baseline": json.dumps(spec.baseline_cell),
                "storage": mask_url(storage_url), "n_trials": len(cells),
                "model_preset": spec.model_preset(preset.model_size)},
        tags={"hmer.preset": preset.name, "hmer.kind": "grid", "hmer.variant": spec.name},
        artifact={"spec": spec.name, "description": spec.description, "grid": space,
                  "baseline": spec.baseline_cell, "config": base.to_flat_dict()})
    experiment_id, parent = session.experiment_id, session.parent_run_id

    children: list = []
    failed_here: set[str] = set()
    interrupted = False
    try:
        if data is None and status.open_cells(cells, set()):
            data = _load_data(base, say)  # once per process; the extra workers then read the warm cache
        if main:
            children = _start_workers("grid", spec, preset, n_jobs, storage_url, tracking_uri, data_path, name,
                                      seeds, overrides)
        _set_threads(n_jobs)
        _grid_worker_loop(session, spec, preset, sampler, claims, cells, space, data, failed_here, wait=main)
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: the trial in progress is marked FAIL; run the same command to resume")
        raise
    finally:
        for child in children:
            child.join()
        status = claims.status()
        n_complete = sum(cell_key(c) in status.complete for c in cells)
        complete = n_complete == len(cells)
        if main:
            fail_dead_trial_runs(session.client, experiment_id, study)
            _finish_parent(session, complete, [describe_cell_key(k) for k in sorted(failed_here)], interrupted)
    outcome = StudyOutcome(study_name=name, storage=storage_url, tracking_uri=tracking_uri, experiment=name,
                           parent_run_id=parent, complete=complete, n_complete=n_complete, n_expected=len(cells),
                           failed=[describe_cell_key(k) for k in sorted(failed_here)])
    if main:
        say(f"study {name}: {n_complete} of {len(cells)} cells complete"
            + ("" if complete else f"; failed: {'; '.join(outcome.failed) or 'none here'} "
               f"(run the same command to retry them)"))
        outcome.table = grid_table(name, tracking_uri)
        if print_table and outcome.table:
            print(outcome.table, flush=True)
    return outcome


def _grid_worker_loop(session: _Session, spec: StudySpec, preset: StudyPreset, sampler: ClaimedGridSampler,
                      claims: CellClaims, cells: list[dict[str, Any]], space: Mapping[str, Sequence[Any]],
                      data: dict[str, list] | None, failed_here: set[str], wait: bool) -> None:
    """Claim and run cells until none is open; with `wait`, also wait out the other workers.

    A cell whose trial raised an error in this session (in any worker) is not retried until
    the command runs again; `failed_here` collects them.
    """
    started = time.time()
    while True:
        failed_here |= claims.errored_since(started)
        if data is None and claims.status().open_cells(cells, failed_here):
            # Before claiming: a claim must turn into a trial within seconds, loading takes minutes.
            data = _load_data(session.base, session.say)
        cell = claims.claim(cells, skip=failed_here)
        if cell is None:
            status = claims.status()
            if not wait or not (status.running | status.claimed):
                return
            time.sleep(POLL_S)  # another worker runs the last cells; if it dies they open again
            claims.reap()
            fail_dead_trial_runs(session.client, session.experiment_id, session.study)
            continue
        if data is None:  # a cell opened (its worker died) after the check above
            claims.release()
            continue
        state = _run_grid_trial(session, spec, preset, sampler, claims, cell, space, data)
        if state != TrialState.COMPLETE:
            failed_here.add(cell_key(cell))  # not again in this session: a rerun retries it


def _run_grid_trial(session: _Session, spec: StudySpec, preset: StudyPreset, sampler: ClaimedGridSampler,
                    claims: CellClaims, cell: Mapping[str, Any], space: Mapping[str, Sequence[Any]],
                    data: dict[str, list]) -> TrialState:
    from ..training import train

    ordered = {**{k: cell[k] for k in spec.axes}, SEED_KEY: cell[SEED_KEY]}
    variant, label, seed = variant_label(ordered), cell_label(ordered), int(cell[SEED_KEY])
    baseline = all(ordered[k] == v for k, v in spec.baseline_cell.items())
    numbers: list[int] = []

    def on_start(study: optuna.Study, trial: FrozenTrial) -> None:
        numbers.append(trial.number)
        claims.started(trial, ordered, {"hmer.cell": label, "hmer.variant": variant, "hmer.seed": seed})

    def objective(trial: optuna.Trial) -> float:
        params = {key: trial.suggest_categorical(key, list(values)) for key, values in space.items()}
        cfg = session.base.override(spec.overrides(params)).validate()
        tags = {"hmer.study": session.study.study_name, "hmer.trial": str(trial.number), "hmer.cell": label,
                "hmer.seed": str(seed), "hmer.variant": variant, "hmer.preset": preset.name,
                "hmer.baseline": str(baseline).lower()}
        session.say(f"trial {trial.number}: {label}, seed {seed} ...")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"hmer-{session.study.study_name}-{trial.number}-") as run_dir:
            try:
                result = train(cfg, data=data, tracking_uri=session.tracking_uri, experiment=session.experiment,
                               run_name=f"{variant} seed {seed}", parent_run_id=session.parent_run_id, tags=tags,
                               run_dir=run_dir)
            except Exception as exc:
                trial.set_user_attr(ERROR_ATTR, f"{type(exc).__name__}: {exc}"[:2000])
                session.say(f"trial {trial.number}: {label}, seed {seed} FAILED: {type(exc).__name__}: {exc}")
                raise
        _record_result(trial, result)
        scores = ", ".join(f"{y} {s.exprate:.1f}" for y, s in result.test_scores.items())
        session.say(f"trial {trial.number}: {label}, seed {seed}: validation ExpRate {result.best_val_exprate:.1f}, "
                    f"test ExpRate {scores} ({time.monotonic() - t0:.0f} s, {result.epochs} epochs, "
                    f"stopped by {result.stopped_by})")
        return result.best_val_exprate

    sampler.assign(ordered, on_start)
    return _optimize_one(session, objective, numbers)


def _optimize_one(session: _Session, objective: Callable[[optuna.Trial], float], numbers: list[int]) -> TrialState:
    """Run one trial of `objective` (which appends its trial number to `numbers`); its final state."""
    try:
        session.study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=True)
    except optuna.exceptions.UpdateFinishedTrialError:
        # Another worker failed the trial while it ran: its heartbeat was silent for longer than
        # the grace period (a database outage, a frozen machine). Its cell is open again.
        session.say(f"trial {numbers[0] if numbers else '?'}: was marked FAIL by another worker while it ran "
                    f"(no heartbeat for {3 * heartbeat_s()} s); its result is not kept and its cell runs again")
        fail_dead_trial_runs(session.client, session.experiment_id, session.study)
        return TrialState.FAIL
    if not numbers:
        return TrialState.FAIL
    storage = session.study._storage
    return storage.get_trial(storage.get_trial_id_from_study_id_trial_number(session.study._study_id,
                                                                            numbers[0])).state


def _record_result(trial: optuna.Trial, result) -> None:
    """The run id and test scores on the trial, where `optuna trials` and the dashboard show them."""
    trial.set_user_attr("mlflow_run_id", result.run_id)
    trial.set_user_attr("epochs", result.epochs)
    trial.set_user_attr("stopped_by", result.stopped_by)
    for year, scores in result.test_scores.items():
        trial.set_user_attr(f"test_{year}_exprate", scores.exprate)
        trial.set_user_attr(f"test_{year}_le1", scores.le1)
        trial.set_user_attr(f"test_{year}_le2", scores.le2)
        trial.set_user_attr(f"test_{year}_n", scores.n)


def _start_workers(kind: str, spec, preset: StudyPreset, n_jobs: int, storage_url: str, tracking_uri: str,
                   data_path: str | None, name: str, seeds: Sequence[int] | None, overrides, n_trials: int = 0):
    """The n_jobs - 1 extra worker processes (spawned: fresh interpreters, safe with torch and SQLite)."""
    if n_jobs <= 1:
        return []
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for _ in range(n_jobs - 1):
        proc = ctx.Process(target=_worker_main, kwargs=dict(
            kind=kind, spec=spec, preset=preset, n_jobs=n_jobs, storage=storage_url,
            tracking_uri=tracking_uri, data_path=data_path, study_name=name, seeds=seeds,
            overrides=dict(overrides or {}), n_trials=n_trials))
        proc.start()
        procs.append(proc)
    return procs


def _worker_main(kind: str, spec, preset: StudyPreset, n_jobs: int, storage: str, tracking_uri: str, data_path: str | None,
                 study_name: str, seeds, overrides: dict[str, Any], n_trials: int) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    common = dict(storage=storage, tracking_uri=tracking_uri, n_jobs=n_jobs, data_path=data_path,
                  study_name=study_name, overrides=overrides, role="worker")
    try:
        if kind == "grid":
            run_grid_study(spec, preset, seeds=seeds, print_table=False, **common)
        else:
            run_sweep(spec, preset, n_trials=n_trials, **common)
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the group; the main one reports it
        pass


# ---- the table ------------------------------------------------------------------------------------

def grid_table(study_name: str, tracking_uri: str) -> str:
    """The per-year table of the study from `hmer.reports`: mean ± std over seeds of ExpRate,
    <=1 and <=2, and each variant against the baseline with paired tests over test expressions."""
    from ..reports.tables import format_table, study_table

    return format_table(study_table(study_name, tracking_uri))


# ---- sweeps -----------------------------------------------------------------------------------------

def run_sweep(
    spec: SweepSpec,
    preset: str | StudyPreset = "smoke",
    *,
    storage: str | None = None,
    tracking_uri: str | None = None,
    n_jobs: int | None = None,
    data_path: str | None = None,
    data: dict[str, list] | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    role: str = "main",
) -> StudyOutcome:
    """Run (or resume) a TPE sweep with median pruning until `n_trials` trials have finished.

    Trials report validation ExpRate every epoch; the median pruner stops the ones below
    the median of earlier trials at the same epoch (Optuna state PRUNED, MLflow tag
    hmer.status=pruned, run KILLED). A trial that fails in a live worker (diverged, out of
    memory) counts as finished; one whose worker died is marked FAIL and replaced.
    With several workers the study may end up to n_jobs - 1 trials over `n_trials`.
    `pruner` replaces the median pruner (the extra workers of n_jobs keep the median pruner).
    """
    setup = _setup(spec.name, preset, n_jobs=n_jobs, data=data, study_name=study_name, role=role,
                   tracking_uri=tracking_uri, storage=storage)
    preset, n_jobs, name, main, say = setup.preset, setup.n_jobs, setup.name, setup.main, setup.say
    tracking_uri, storage_url = setup.tracking_uri, setup.storage_url
    n_trials = int(n_trials or preset.sweep_trials)
    base = base_config(spec.model_preset(preset.model_size), preset, n_trials, n_jobs, spec.fixed, overrides,
                       data_path).override({SEED_KEY: spec.seed})
    base_flat = base.to_flat_dict()
    space = {p.key: _describe_param(p, base_flat) for p in spec.params}
    if main:
        say(f"study {name}: {spec.description}")
        say(preset.describe(n_trials, n_jobs))
        say(f"  search space: {'; '.join(f'{k} {v}' for k, v in space.items())}; {n_trials} trials, "
            f"TPE + median pruning on validation ExpRate per epoch")
        say(f"  Optuna storage {mask_url(storage_url)}; MLflow {mask_password(tracking_uri)}, experiment {name}")

    if data is None and not study_exists(storage_url, name):
        data = _load_data(base, say)  # bad data fails here, before a study or an MLflow run exists
    sampler = optuna.samplers.TPESampler(multivariate=True, constant_liar=True,
                                         n_startup_trials=max(2, min(10, n_trials // 3)))
    pruner = pruner or optuna.pruners.MedianPruner(n_startup_trials=max(2, n_trials // 5), n_warmup_steps=1)
    attrs = {"hmer.spec": spec.name, "hmer.preset": preset.name, "hmer.space": space, "hmer.experiment": name,
             "hmer.n_trials": n_trials}
    study, base, created = _open_study(name=name, kind="sweep", storage_url=storage_url, sampler=sampler,
                                       pruner=pruner, attrs=attrs, base=base)
    base_flat = base.to_flat_dict()
    worker = Worker.current()
    claims = CellClaims(study, worker)  # used only to find the trials of dead workers
    reaped = claims.reap()
    if reaped and main:
        say(f"resuming: trial(s) {', '.join(str(t.number) for t in reaped)} of a dead worker marked FAIL "
            f"and replaced")
    session = _open_session(
        setup, study, base, created, worker,
        params={"study": name, "kind": "sweep", "spec": spec.name, "preset": preset.name,
                "space": json.dumps(space), "n_trials": n_trials, "storage": mask_url(storage_url),
                "model_preset": spec.model_preset(preset.model_size)},
        tags={"hmer.preset": preset.name, "hmer.kind": "sweep", "hmer.variant": spec.name},
        artifact={"spec": spec.name, "description": spec.description, "space": space, "n_trials": n_trials,
                  "config": base_flat})
    experiment_id, parent = session.experiment_id, session.parent_run_id

    children: list = []
    failures_in_a_row = 0
    interrupted = False
    try:
        if data is None and _finished_trials(study) < n_trials:
            data = _load_data(base, say)  # once per process; the extra workers then read the warm cache
        if main:
            children = _start_workers("sweep", spec, preset, n_jobs, storage_url, tracking_uri, data_path, name,
                                      None, overrides, n_trials)
        _set_threads(n_jobs)
        while _finished_trials(study) < n_trials:
            if data is None:  # a trial of a dead worker must be replaced after all
                data = _load_data(base, say)
            state = _run_sweep_trial(session, spec, preset, base_flat, data)
            failures_in_a_row = failures_in_a_row + 1 if state == TrialState.FAIL else 0
            if failures_in_a_row >= 3:
                say("three trials in a row failed in this worker: stopping it (see the errors above)")
                break
            claims.reap()
            fail_dead_trial_runs(session.client, experiment_id, study)
        if main:
            while study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                time.sleep(POLL_S)  # the other workers' last trials
                claims.reap()
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: the trial in progress is marked FAIL; run the same command to resume")
        raise
    finally:
        for child in children:
            child.join()
        n_finished = _finished_trials(study)
        complete = n_finished >= n_trials
        if main:
            fail_dead_trial_runs(session.client, experiment_id, study)
            _finish_parent(session, complete, [], interrupted)
    outcome = StudyOutcome(study_name=name, storage=storage_url, tracking_uri=tracking_uri, experiment=name,
                           parent_run_id=parent, complete=complete, n_complete=n_finished, n_expected=n_trials)
    if main:
        outcome.table = sweep_table(study)
        print(outcome.table, flush=True)
    return outcome


def _describe_param(param, base_flat: Mapping[str, Any]) -> str:
    dist = param.distribution(base_flat)
    if hasattr(dist, "choices"):
        return f"in {list(dist.choices)}"
    return f"in [{dist.low:g}, {dist.high:g}]" + (" (log)" if dist.log else "")


def _finished_trials(study: optuna.Study) -> int:
    """COMPLETE and PRUNED trials, and FAIL ones that failed in a live worker (a real outcome)."""
    count = 0
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            count += 1
        elif t.state == TrialState.FAIL and ERROR_ATTR in t.user_attrs:
            count += 1
    return count


def _run_sweep_trial(session: _Session, spec: SweepSpec, preset: StudyPreset, base_flat: Mapping[str, Any],
                     data: dict[str, list]) -> TrialState:
    from ..training import train

    numbers: list[int] = []

    def objective(trial: optuna.Trial) -> float:
        numbers.append(trial.number)
        trial.set_user_attr(WORKER_ATTR, session.worker.as_attr())
        values: dict[str, Any] = {}
        for param in spec.params:
            values.update(param.overrides(param.suggest(trial, base_flat), base_flat))
        label = ",".join(f"{k}={_short(v)}" for k, v in values.items())
        trial.set_user_attr("hmer.cell", label)
        cfg = session.base.override(values).validate()
        tags = {"hmer.study": session.study.study_name, "hmer.trial": str(trial.number), "hmer.cell": label,
                "hmer.seed": str(cfg.train.seed), "hmer.variant": f"trial {trial.number}",
                "hmer.preset": preset.name}

        def report(epoch: int, metrics: dict[str, float]) -> None:
            value = metrics.get("val_exprate")
            if value is None:
                return
            trial.report(value, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"validation ExpRate {value:.2f} at epoch {epoch} is below the median")

        session.say(f"trial {trial.number}: {label} ...")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"hmer-{session.study.study_name}-{trial.number}-") as run_dir:
            try:
                result = train(cfg, data=data, tracking_uri=session.tracking_uri, experiment=session.experiment,
                               run_name=f"trial {trial.number}", parent_run_id=session.parent_run_id, tags=tags,
                               epoch_callback=report, run_dir=run_dir)
            except optuna.TrialPruned as exc:
                session.say(f"trial {trial.number}: pruned ({exc})")
                raise
            except Exception as exc:
                trial.set_user_attr(ERROR_ATTR, f"{type(exc).__name__}: {exc}"[:2000])
                session.say(f"trial {trial.number}: FAILED: {type(exc).__name__}: {exc}")
                raise
        _record_result(trial, result)
        session.say(f"trial {trial.number}: validation ExpRate {result.best_val_exprate:.1f} "
                    f"({time.monotonic() - t0:.0f} s, {result.epochs} epochs)")
        return result.best_val_exprate

    return _optimize_one(session, objective, numbers)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def sweep_table(study: optuna.Study) -> str:
    """The sweep's trials, best validation ExpRate first, with their test scores and parameters."""
    import pandas as pd

    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name,
                               "val ExpRate": t.value if t.value is not None else math.nan}
        for key, value in t.user_attrs.items():
            if key.startswith("test_") and key.endswith("_exprate"):
                row[key[len("test_"):-len("_exprate")] + " ExpRate"] = value
        if t.state == TrialState.PRUNED and t.intermediate_values:
            row["val ExpRate"] = max(t.intermediate_values.values())
        row.update({k: _short(v) for k, v in t.params.items()})
        rows.append(row)
    if not rows:
        return "(no trials)"
    df = pd.DataFrame(rows).sort_values("val ExpRate", ascending=False, na_position="last")
    counts = ", ".join(f"{n} {s.lower()}" for s, n in df["state"].value_counts().items())
    return f"sweep {study.study_name}: {len(df)} trials ({counts})\n" + df.to_string(index=False, float_format="%.2f")
