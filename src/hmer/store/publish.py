"""`hmer runs publish WORKSPACE`: a workspace's store copied into the checkout's `mlruns/`, to be committed.

The copy is built in `mlruns/.publishing/` and replaces the committed store's files only once clean:
unfinished studies left out or kept (`store.unfinished`); what runs closed in the copy (`close_running`:
a trial FAIL as if its worker died, its run KILLED), going on in the workspace; every study presented;
no machine path left (`store.clean`); then `clean.store_problems` must find nothing.

It holds the store's lock throughout. SIGTERM or Ctrl-C removes the staging copy and changes nothing,
or, in the last step (files moved into place, well under a second), waits for it. Killed outright
there, the store may be part old, part new; the next publish names the stale lock and writes it all.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..signals import deferred
from ..tracking import keys
from ..tracking.lock import no_training, store_lock
from ..tracking.portable import ARTIFACTS, CHECKPOINTS, STORE_FILES, copy_store, make_portable
from ..tracking.store import search_all_runs

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
    import optuna

    from ..tracking.portable import snapshot_database
    from ..tracking.store import mlflow_client

    # dest's databases read from snapshots: one that is not a database is named in one line
    target = copy / "target"
    target.mkdir()
    for name in STORE_FILES:
        if (dest / name).is_file():
            snapshot_database(dest / name, target / name)

    def runs(folder: Path) -> set[str]:
        db = folder / "mlflow.db"
        return {r.info.run_id for r in search_all_runs(mlflow_client(f"sqlite:///{db}"), deleted_too=True)} \
            if db.is_file() else set()

    def studies(folder: Path) -> set[str]:
        db = folder / "optuna.db"
        return {s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{db}", include_best_trial=False)} \
            if db.is_file() else set()

    theirs, ours = runs(target), runs(copy)
    lost = sorted(studies(target) - studies(copy))
    shutil.rmtree(target)
    missing = sorted(theirs - ours)
    if missing:
        return (f"{len(missing)} of the {len(theirs)} runs of {dest} are not in it (e.g. {missing[0]}): it is not "
                f"a workspace made from {dest} (hmer runs workspace)")
    if lost:
        return f"{len(lost)} Optuna stud{'y' if len(lost) == 1 else 'ies'} of {dest} are not in it (e.g. {lost[0]})"
    return None


def _publish(source: Path, dest: Path, *, keep_unfinished: bool, weights_only: bool, replace: bool) -> Published:
    from .clean import make_paths_portable, store_problems
    from .present import present_studies
    from .unfinished import drop_studies, keep_resumable_checkpoints, resumable_runs, unfinished_studies
    from ..tracking.store import mlflow_client
    from ..tracking.ui import mark_training_experiments

    staging = dest / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # a publish that was killed
    try:
        # presented while its artifact locations are absolute (a portable one's would land relative
        # to the working folder), then made portable
        db = copy_store(source, staging, portable=False, checkpoints=keep_unfinished)
        uri = f"sqlite:///{db}"
        optuna_db = staging / "optuna.db"
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
    if storage is not None:
        closed += _fail_running_trials(storage)
    from mlflow.entities import RunStatus

    running = search_all_runs(client, filter_string="attributes.status = 'RUNNING'", deleted_too=True)
    from .rename import close_superseded_parent

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


def _fail_running_trials(storage: str) -> list[str]:
    """Mark FAIL the RUNNING trials of every study in `storage`, as a next worker does a dead worker's
    (`bookings.CellBookings.reap`), and continues them."""
    import optuna
    from optuna.trial import TrialState

    from ..studies.bookings import mark_failed
    from ..studies.storage import open_storage, trial_id

    store = open_storage(storage)
    closed = []
    reason = (f"its worker was training it in the workspace when it was published (hmer runs publish, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); marked FAIL in the published copy")
    for summary in optuna.get_all_study_summaries(store, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=store)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if mark_failed(store, trial_id(store, study, trial.number), reason):
                closed.append(f"Optuna study {summary.study_name} trial {trial.number}: FAIL")
    return closed
