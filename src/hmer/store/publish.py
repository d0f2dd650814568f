"""`hmer runs publish WORKSPACE`: a workspace's store copied into the checkout's `mlruns/`, to be committed.

The copy is built in `mlruns/.publishing/` and replaces the committed store's files only once clean:
unfinished studies left out or kept (below); what runs closed in the copy (`close_running`:
a trial FAIL as if its worker died, its run KILLED), going on in the workspace; every study presented;
no machine path left (`store.clean`); then `clean.store_problems` must find nothing.

It holds the store's lock throughout. SIGTERM or Ctrl-C removes the staging copy and changes nothing,
or, in the last step (files moved into place, well under a second), waits for it. Killed outright
there, the store may be part old, part new; the next publish names the stale lock and writes it all.

An unfinished study has no answer yet, so the published copy keeps only the finished (and superseded)
studies; the others are purged from the copy (`mlflow gc`, the Optuna study), not from the workspace.
`--keep-unfinished` keeps them with the smallest files that continue each cell (docs/studies.md, "Resume").
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import optuna
from mlflow.entities import RunStatus
from optuna.trial import TrialState

from ..signals import deferred
from ..studies.bookings import mark_failed
from ..studies.mlflow_runs import trial_runs
from ..studies.resume import dead_trial_runs
from ..studies.storage import open_storage, trial_id
from ..tracking import keys
from ..tracking.lock import no_training, store_lock
from ..tracking.portable import ARTIFACTS, CHECKPOINTS, STORE_FILES, copy_store, make_portable, snapshot_database
from ..tracking.store import mlflow_client, search_all_runs
from ..tracking.ui import mark_training_experiments
from .clean import MLFLOW_DB, OPTUNA_DB, _read_only, make_paths_portable, store_problems
from .present import present_studies
from .rename import close_superseded_parent

STAGING = ".publishing"  # the copy being made, inside the committed store's folder (git-ignored)


@dataclass
class Published:
    """What a publish did, for the command to print."""

    store: Path
    unfinished: dict[str, str]  # {study: its parent run's hmer.status}, left out or kept
    kept_checkpoints: dict[str, list[str]] = field(default_factory=dict)  # {run id: files kept}
    closed: list[str] = field(default_factory=list)  # what was running, in words
    marked: list[str] = field(default_factory=list)  # experiments marked as model training
    annotated: dict[str, list[str]] = field(default_factory=dict)  # {study: what its parent run got}
    portable: list[str] = field(default_factory=list)  # where machine paths were written portably


def publish(source: str | Path, dest: str | Path, *, keep_unfinished: bool, weights_only: bool = False,
            replace: bool = False) -> Published:
    """Publish the store in the folder `source` into `dest`; `weights_only`: each kept unfinished trial
    continues from its weights alone; `replace`: even a `source` that is not `dest`'s continuation.
    ValueError naming the first problem (`dest` as it was); `StoreLocked` when another publish writes."""
    source, dest = Path(source).resolve(), Path(dest).resolve()
    with store_lock(dest, f"hmer runs publish {source}"), no_training(dest):
        return _publish(source, dest, keep_unfinished=keep_unfinished, weights_only=weights_only, replace=replace)


def not_a_continuation(copy: Path, dest: Path) -> str | None:
    """Why the store `copy` is not `dest`'s continuation (holding each run, deleted too, and Optuna study
    of `dest`), or None: a store made for something else would replace all of `dest` (issue 70)."""
    # dest's databases read from snapshots: one that is not a database is named in one line
    target = copy / "target"
    target.mkdir()
    for name in STORE_FILES:
        if (dest / name).is_file():
            snapshot_database(dest / name, target / name)

    def names(folder: Path, db: str, query: str) -> set[str]:  # every run (deleted too), every Optuna study
        if not (folder / db).is_file():
            return set()
        with _read_only(folder / db) as connection:
            return {name for (name,) in connection.execute(query)}

    runs, studies = "SELECT run_uuid FROM runs", "SELECT study_name FROM studies"
    theirs, ours = names(target, MLFLOW_DB, runs), names(copy, MLFLOW_DB, runs)
    lost = sorted(names(target, OPTUNA_DB, studies) - names(copy, OPTUNA_DB, studies))
    shutil.rmtree(target)
    missing = sorted(theirs - ours)
    if missing:
        return (f"{len(missing)} of the {len(theirs)} runs of {dest} are not in it (e.g. {missing[0]}): it is not "
                f"a workspace made from {dest} (hmer runs workspace)")
    if lost:
        return f"{len(lost)} Optuna stud{'y' if len(lost) == 1 else 'ies'} of {dest} are not in it (e.g. {lost[0]})"
    return None


def _publish(source: Path, dest: Path, *, keep_unfinished: bool, weights_only: bool, replace: bool) -> Published:
    staging = dest / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # a publish that was killed
    try:
        # presented while its artifact locations are absolute (a portable one's would land relative
        # to the working folder), then made portable
        db = copy_store(source, staging, portable=False, checkpoints=keep_unfinished)
        uri = f"sqlite:///{db}"
        optuna_db = staging / OPTUNA_DB
        storage = f"sqlite:///{optuna_db}" if optuna_db.is_file() else None
        client = mlflow_client(uri)
        done = Published(store=dest, unfinished=unfinished_studies(client))
        if not keep_unfinished:
            drop_studies(sorted(done.unfinished), tracking_uri=uri, storage=storage)
        done.closed = close_running(client, storage)
        if keep_unfinished:  # (a store without Optuna studies has no trial to continue)
            resumable = resumable_runs(client, storage, sorted(done.unfinished), staging) if storage else set()
            done.kept_checkpoints = keep_resumable_checkpoints(staging, resumable, client=client,
                                                               weights_only=weights_only)
        done.marked = mark_training_experiments(client)
        done.annotated = {study: changes for study, changes in present_studies(uri, storage).items() if changes}
        done.portable = make_paths_portable(staging, stores=[source])
        make_portable(db)
        problems = store_problems(staging)
        if problems:
            more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
            raise ValueError(f"not published: {problems[0]}{more}; {dest} is as it was")
        # what would be published, against what it replaces: every run and study of dest kept
        foreign = None if replace else not_a_continuation(staging, dest)
        if foreign is not None:
            raise ValueError(f"not published: {source} is not {dest}'s continuation: {foreign}; publish a workspace "
                             f"made from it, or give --replace to put {source} in its place; {dest} is as it was")
        with deferred():  # a SIGTERM here waits: the store is never left part old, part new by one
            _replace(staging, dest)
    finally:
        with deferred():  # nor its staging copy half removed (hundreds of MB, removed in seconds)
            shutil.rmtree(staging, ignore_errors=True)
    return done


def _replace(staging: Path, dest: Path) -> None:
    """The committed store's files replaced by the copy's, each by a rename (an old folder moved into
    the staging folder, removed with it)."""
    for name in STORE_FILES:
        if (staging / name).is_file():
            os.replace(staging / name, dest / name)
    for folder in (ARTIFACTS, CHECKPOINTS):
        if (dest / folder).exists():
            os.replace(dest / folder, staging / f"replaced-{folder}")
        if (staging / folder).exists():
            os.replace(staging / folder, dest / folder)


def close_running(client, storage: str | None) -> list[str]:
    """Close, in a copy of a store, what was running (module docstring); returns what was closed, in words."""
    closed = []
    if storage is not None:  # its RUNNING trials FAIL, as a next worker marks a dead worker's (`CellBookings.reap`)
        store = open_storage(storage)
        reason = (f"its worker was training it in the workspace when it was published (hmer runs publish, "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); marked FAIL in the published copy")
        for summary in optuna.get_all_study_summaries(store, include_best_trial=False):
            study = optuna.load_study(study_name=summary.study_name, storage=store)
            for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if mark_failed(store, trial_id(store, study, trial.number), reason):
                    closed.append(f"Optuna study {summary.study_name} trial {trial.number}: FAIL")
    running = search_all_runs(client, filter_string="attributes.status = 'RUNNING'", deleted_too=True)
    for run in running:
        tags = run.data.tags
        if tags.get(keys.ROLE) == "study" and keys.SUPERSEDED_BY in tags:
            close_superseded_parent(client, run)
            status = "incomplete"
        else:  # a parent as a study stopped with Ctrl-C, a trial's run as one stopped by a signal
            status = "interrupted" if tags.get(keys.ROLE) == "study" else "killed"
            client.set_tag(run.info.run_id, keys.STATUS, status)
            if status == "killed":
                client.set_tag(run.info.run_id, keys.STOPPED_BY,
                               "still running in the workspace when it was published (hmer runs publish): "
                               "the published copy holds it as it stood")
            client.set_terminated(run.info.run_id, status=RunStatus.to_string(RunStatus.KILLED))
        closed.append(f"run {run.info.run_id} ({tags.get(keys.STUDY) or run.info.run_name}): {status}")
    return closed


LAST, BEST = "last.pt", "best.pt"  # a run's checkpoints (hmer.training.trainer)


def unfinished_studies(client) -> dict[str, str]:
    """{study: its parent run's hmer.status} for each study not finished nor superseded (kept as it stopped)."""
    parents = search_all_runs(client, filter_string=f"tags.`{keys.ROLE}` = 'study'")
    return {run.data.tags[keys.STUDY]: run.data.tags.get(keys.STATUS, "unknown") for run in parents
            if run.data.tags.get(keys.STATUS) != "finished" and keys.STUDY in run.data.tags
            and keys.SUPERSEDED_BY not in run.data.tags}


def resumable_runs(client, storage: str, studies: list[str], store: Path) -> set[str]:
    """The runs of `studies` a resumed study continues from their checkpoints in the store folder `store`:
    per unfinished cell, the latest dead trial's with a `last.pt` (as `resume.find_resumable` takes it),
    in a copy whose running trials are closed."""
    known = set(optuna.get_all_study_names(storage))
    runs = set()
    for name in studies:
        experiment = client.get_experiment_by_name(name)
        if experiment is None or name not in known:
            continue
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        finished = {t.user_attrs.get(keys.CELL_KEY) for t in trials
                    if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
        children = trial_runs(client, experiment.experiment_id, name)
        cells: set[str] = {str(t.user_attrs[keys.CELL_KEY]) for t in trials if t.user_attrs.get(keys.CELL_KEY)}
        for cell in cells - finished:
            continued = [run for _, run in dead_trial_runs(trials, children, cell)
                         if (store / CHECKPOINTS / run / LAST).is_file()]
            runs.update(continued[:1])
    return runs


def keep_resumable_checkpoints(store: Path, keep: set[str], *, client=None,
                               weights_only: bool = False) -> dict[str, list[str]]:
    """Delete every checkpoint in the store folder `store` but the smallest files that resume the runs
    `keep` (module docstring); with `weights_only` (and `client`), `last.pt` rewritten by
    `training.resume.standalone_continuation` (and `best.pt` once every epoch is done). Returns {run id:
    the files kept}."""
    from ..checkpoint import atomic_torch_save, load_checkpoint
    from ..training.carry import epoch_readings
    from ..training.resume import best_weights_recoverable, standalone_continuation

    root = store / CHECKPOINTS
    if not root.is_dir():
        return {}
    kept: dict[str, list[str]] = {}
    for run in sorted(root.iterdir()):
        if run.name not in keep or not (run / LAST).is_file():
            shutil.rmtree(run) if run.is_dir() else run.unlink()
            continue
        last = load_checkpoint(run / LAST)
        needed = {LAST} if best_weights_recoverable(int(last["epoch"]), int(last["best_epoch"])) else {LAST, BEST}
        if weights_only:
            best = load_checkpoint(run / BEST) if (run / BEST).is_file() else None
            readings = functools.partial(epoch_readings, client, run.name)
            last, weights, _ = standalone_continuation(last, best, readings)
            needed = {LAST, BEST} if weights == "best" else {LAST}
            atomic_torch_save(last, run / LAST)
        for item in run.iterdir():
            if item.name not in needed:
                shutil.rmtree(item) if item.is_dir() else item.unlink()
        kept[run.name] = sorted(f.name for f in run.iterdir())
    if not kept:
        root.rmdir()
    return kept


def drop_studies(names: list[str], *, tracking_uri: str, storage: str | None) -> None:
    """Purge the studies `names` (MLflow experiments, runs, artifacts, Optuna studies) from a copy of a store."""
    client = mlflow_client(tracking_uri)
    in_storage = set(optuna.get_all_study_names(storage)) if storage is not None else set()
    ids = []
    for name in names:
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            if experiment.lifecycle_stage == "active":
                client.delete_experiment(experiment.experiment_id)
            ids.append(experiment.experiment_id)
        if storage is not None and name in in_storage:
            optuna.delete_study(study_name=name, storage=storage)
    if ids:
        runs = search_all_runs(client, ids, deleted_too=True)
        # --tracking-uri too: without it, gc stopped on the real workspace with "Tracking URL is not set"
        done = subprocess.run([sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", tracking_uri,
                               "--tracking-uri", tracking_uri, "--experiment-ids", ",".join(ids)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"mlflow gc of {', '.join(names)} in {tracking_uri} failed: {last}")
        for run in runs:  # gc empties a run's artifact folder and leaves the folder itself
            uri = run.info.artifact_uri
            if uri.startswith("file://"):
                folder = Path(urlparse(uri).path).parent
                if folder.is_dir() and not any(p.is_file() for p in folder.rglob("*")):
                    shutil.rmtree(folder)
