"""A study renamed in its store (`hmer runs rename STUDY NEW`), or labelled superseded (`hmer runs supersede`).

Renamed: its MLflow experiment, its runs' `hmer.study` tag, its parent run's name and `study` param,
its Optuna study and `hmer.experiment`. (A study re-run at a redefined budget keeps its name, so the
one it supersedes gives the name up first, or the re-run would resume it.) Optuna cannot rename a
study: it is copied and the old one deleted last; each step skips what is done, so running the
command again repairs an interrupted rename.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from ..studies.bookings import mark_failed, worker_alive
from ..studies.spec import check_study_name
from ..tracking import keys
from ..tracking.portable import set_params, sqlite_path
from ..studies.storage import default_storage, open_storage, trial_id
from ..tracking.store import default_tracking_uri, mlflow_client, search_all_runs, study_filter
from .clean import STUDY_PARAM


@dataclass(frozen=True)
class Renamed:
    study: str
    new: str
    runs: int  # runs retagged by this call
    experiment: bool  # the MLflow experiment was renamed by this call
    trials: int  # trials of the Optuna study under its new name


def rename_study(study: str, new: str, *, tracking_uri: str | None = None, storage: str | None = None) -> Renamed:
    """Rename `study` to `new` in the MLflow store and the Optuna storage. Refuses, changing nothing, a
    study not there, a name taken, and a RUNNING trial whose worker may run (a dead one is marked FAIL)."""
    if not new or new == study:
        raise ValueError(f"rename {study!r}: give a new name other than the study's own")
    check_study_name(new)
    uri = tracking_uri or default_tracking_uri()
    client = mlflow_client(uri)
    url = storage or default_storage(uri)
    optuna_storage = open_storage(url)
    names = set(optuna.get_all_study_names(optuna_storage))
    runs = _tagged_runs(client, study)
    experiment = client.get_experiment_by_name(study)
    copied = new in names and study in names and _same_trials(optuna_storage, study, new)
    if study not in names and not runs and experiment is None:
        if new in names or _tagged_runs(client, new):
            raise ValueError(f"no study {study!r} in {uri} or {url}: {new!r} is there (already renamed?)")
        raise ValueError(f"no study {study!r} in {uri} or {url}")
    if new in names and not copied:
        raise ValueError(f"{url} already has an Optuna study {new!r}: choose another name")
    if experiment is not None and client.get_experiment_by_name(new) is not None:
        raise ValueError(f"{uri} already has an experiment {new!r}: choose another name")
    if study in names:
        old = optuna.load_study(study_name=study, storage=optuna_storage)
        running = old.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        dead = [t for t in running if worker_alive(t.user_attrs.get(keys.WORKER)) is False]
        live = [t for t in running if t not in dead]
        if live:
            raise ValueError(f"study {study!r} has {len(live)} RUNNING trial(s) "
                             f"({', '.join(str(t.number) for t in live)}): stop its workers, or let it finish")
        for trial in dead:  # what the study's next worker would do (bookings.CellBookings.reap)
            mark_failed(optuna_storage, trial_id(optuna_storage, old, trial.number),
                        "worker is gone; marked FAIL by hmer runs rename")

    if study in names and not copied:
        optuna.copy_study(from_study_name=study, from_storage=optuna_storage, to_storage=optuna_storage,
                          to_study_name=new)
    if study in names or new in names:  # the copy says where it logs: the experiment renamed below
        optuna.load_study(study_name=new, storage=optuna_storage).set_user_attr(keys.EXPERIMENT, new)
    db = sqlite_path(uri)
    for run in runs:
        client.set_tag(run.info.run_id, keys.STUDY, new)
        if run.data.tags.get(keys.ROLE) == "study" and run.info.run_name == study:
            client.set_tag(run.info.run_id, keys.MLFLOW_RUN_NAME, new)  # the parent run is named after its study
        if run.data.tags.get(keys.ROLE) == "study" and run.data.params.get(STUDY_PARAM) == study and db is not None:
            set_params(db, {(run.info.run_id, STUDY_PARAM): new})
    if experiment is not None:
        client.rename_experiment(experiment.experiment_id, new)
    if study in names:
        optuna.delete_study(study_name=study, storage=optuna_storage)
    trials = len(optuna.load_study(study_name=new, storage=optuna_storage).trials) \
        if new in names or study in names else 0
    return Renamed(study=study, new=new, runs=len(runs), experiment=experiment is not None, trials=trials)


def _tagged_runs(client, study: str) -> list:
    """Every run tagged as the study's, in any experiment, deleted too (restored, it keeps the tag)."""
    return search_all_runs(client, filter_string=study_filter(study), deleted_too=True)


def _same_trials(storage, study: str, new: str) -> bool:
    """Whether `new` is a whole copy of `study` (an interrupted rename), trial for trial."""
    old = optuna.load_study(study_name=study, storage=storage).trials
    copy = optuna.load_study(study_name=new, storage=storage).trials
    return [(t.number, t.state, t.params, t.user_attrs) for t in old] == \
        [(t.number, t.state, t.params, t.user_attrs) for t in copy]


def mark_superseded(study: str, by: str, *, tracking_uri: str | None = None) -> str:
    """Label `study` as superseded by `by`: tag `hmer.superseded_by` on its experiment and parent run, the
    experiment's description, a RUNNING parent closed, its table written; returns the description."""
    uri = tracking_uri or default_tracking_uri()
    client = mlflow_client(uri)
    if study == by:
        raise ValueError(f"a study cannot supersede itself ({study!r})")
    experiment = client.get_experiment_by_name(study)
    if experiment is None:
        raise ValueError(f"no study {study!r} in {uri}")
    if client.get_experiment_by_name(by) is None:
        raise ValueError(f"no study {by!r} in {uri}: run it before labelling {study!r} as superseded by it")
    chain, later = [by], client.get_experiment_by_name(by)
    while later is not None and keys.SUPERSEDED_BY in later.tags:  # what `by` is superseded by, and so on
        chain.append(later.tags[keys.SUPERSEDED_BY])
        if chain[-1] == study:
            raise ValueError(f"{study!r} cannot be superseded by {by!r}: {' -> '.join(chain)} supersedes it already "
                             f"(a study superseded by its own successor would leave the reports no study to read)")
        if chain[-1] in chain[:-1]:
            break
        later = client.get_experiment_by_name(chain[-1])
    note = (f"Superseded by the study {by}: this one is kept for reference, and the suite's reports "
            f"and claims read {by}.")
    if experiment.tags.get(keys.SUPERSEDED_BY) != by:
        client.set_experiment_tag(experiment.experiment_id, keys.SUPERSEDED_BY, by)
    if experiment.tags.get(keys.MLFLOW_NOTE) != note:
        client.set_experiment_tag(experiment.experiment_id, keys.MLFLOW_NOTE, note)
    for run in _tagged_runs(client, study):
        if run.data.tags.get(keys.ROLE) == "study":
            if run.data.tags.get(keys.SUPERSEDED_BY) != by:
                client.set_tag(run.info.run_id, keys.SUPERSEDED_BY, by)
            if run.info.status == "RUNNING":
                close_superseded_parent(client, run)
    from .study_run import annotate_study

    annotate_study(study, uri)
    return note


def close_superseded_parent(client, run) -> None:
    """End the parent run of a superseded study that stopped unfinished (nothing continues it): KILLED,
    `hmer.status=incomplete`, at its last trial's end (so that closing it again writes the same)."""
    children = search_all_runs(client, [run.info.experiment_id],
                               f"tags.`{keys.MLFLOW_PARENT_RUN_ID}` = '{run.info.run_id}'")
    ends = [c.info.end_time for c in children if c.info.end_time]
    client.set_tag(run.info.run_id, keys.STATUS, "incomplete")
    client.set_terminated(run.info.run_id, status="KILLED", end_time=max(ends) if ends else run.info.start_time)
