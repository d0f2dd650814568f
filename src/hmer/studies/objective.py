"""The objective every study shares: train one config as one trial (`train_trial`), as one MLflow child
run of the study's parent (`hmer.training.train`), its run id and test scores recorded on the trial.
A trial that continues a killed one (`resume.py`) continues its run from the last checkpoint.

A grid cell that another study has already trained, by code of this code's fingerprint and never resumed
under other code, is copied (`find_trained`, `copy_run`), not trained again: docs/studies.md, "Cells that
studies share".
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import optuna
from optuna.trial import TrialState

from ..config import Config
from ..tracking import keys
from ..tracking.portable import download_run_artifact, list_run_artifacts, load_run_json
from ..tracking.run import log_batch, log_params
from ..tracking.store import search_all_runs, study_filter
from .resume import Resumable, adopt, checkpoint_dir, find_branch, find_resumable, same_config
from .session import Session
from .storage import GRACE_HEARTBEATS, heartbeat_s, trial_id


def train_trial(trial: optuna.Trial, cfg: Config, session: Session, data: dict[str, list], *, name: str,
                tags: Mapping[str, str], run_name: str, cell_key: str | None = None,
                report: Callable[[int, dict[str, float]], None] | None = None):
    """Train `cfg` as `trial`; the `TrainResult`. `name`: the trial in words for the log; `tags`: the run's
    MLflow tags besides study and trial; `cell_key`: the grid cell, whose killed trial of the same config
    is continued (None: from scratch); `report`: called after every epoch with its metrics (a sweep's pruning)."""
    from ..training import train

    resumable = find_resumable(session, cell_key, cfg) if cell_key else None
    branch = find_branch(session, cfg) if resumable is None else None
    tags = {keys.STUDY: session.name, keys.TRIAL: str(trial.number), **tags}
    if resumable is not None:
        adopt(resumable, trial, session)
        session.say(f"trial {trial.number}: {name}: resuming run {resumable.run_id} from epoch "
                    f"{resumable.epoch + 1} (trial {resumable.trial} stopped there: its worker died)")
    elif branch is not None:
        trial.set_user_attr(keys.BRANCHED_FROM, branch.tag)
        session.say(f"trial {trial.number}: {name}: starting from run {branch.run_id} at epoch {branch.epoch}, "
                    f"where its decay began (the same config, shorter) ...")
    else:
        session.say(f"trial {trial.number}: {name} ...")
    t0 = time.monotonic()
    try:
        result = train(cfg, data=data, tracking_uri=session.tracking_uri, experiment=session.name,
                       run_name=run_name, parent_run_id=session.parent_run_id, tags=tags, epoch_callback=report,
                       resume=resumable.checkpoint if resumable else False, start_from=branch,
                       run_dir=checkpoint_dir(resumable.run_id, session.tracking_uri) if resumable else None)
    except optuna.TrialPruned as exc:
        _drop_checkpoints(session, trial.number, resumable)
        session.say(f"trial {trial.number}: pruned ({exc})")
        raise
    except Exception as exc:
        trial.set_user_attr(keys.ERROR, f"{type(exc).__name__}: {exc}"[:2000])
        _drop_checkpoints(session, trial.number, resumable)
        session.say(f"trial {trial.number}: {name} FAILED: {type(exc).__name__}: {exc}")
        raise
    # A KeyboardInterrupt leaves the checkpoints: the next run of the command continues from them.
    record_result(trial, result)
    _drop_finished_checkpoints(checkpoint_dir(result.run_id, session.tracking_uri))
    scores = ", ".join(f"{y} {s.exprate:.1f}" for y, s in result.test_scores.items())
    session.say(f"trial {trial.number}: {name}: validation ExpRate {result.best_val_exprate:.1f}, "
                f"test ExpRate {scores or '-'} ({time.monotonic() - t0:.0f} s, {result.epochs} epochs, "
                f"stopped by {result.stopped_by})")
    return result


def copy_trial(trial: optuna.Trial, session: Session, trained, *, name: str, tags: Mapping[str, str],
               run_name: str) -> float:
    """Make `trained` (another study's run of this cell's config) this trial's run by copying it
    (`copy_run`); its best validation ExpRate."""
    run_id = copy_run(session.client, trained, experiment_id=session.experiment_id,
                      parent_run_id=session.parent_run_id, run_name=run_name,
                      tags={keys.STUDY: session.name, keys.TRIAL: str(trial.number), **tags})
    # what `record_result` puts on a trial, read from the copied run (its epochs: the last step of its loss)
    metrics = session.client.get_run(run_id).data.metrics
    epochs = max((m.step for m in session.client.get_metric_history(run_id, "train_loss")), default=0)
    for key, value in {keys.TRIAL_RUN_ID: run_id, keys.TRIAL_EPOCHS: int(epochs), keys.TRIAL_STOPPED_BY: "epochs",
                       **{keys.trial_score(k): v for k, v in metrics.items() if k.startswith("test_")}}.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr(keys.REUSED_FROM, {"run": trained.run_id, "study": trained.study})
    session.say(f"trial {trial.number}: {name}: copied run {trained.run_id} of study {trained.study} "
                f"(the same config and seed) instead of training it; validation ExpRate "
                f"{trained.best_val_exprate:.1f}")
    return trained.best_val_exprate


def _drop_finished_checkpoints(folder: Path) -> None:
    """Delete a finished trial's checkpoints (its model is in MLflow) but the state where a wsd run's decay
    began, which its longer cells start from (`hmer.studies.resume.find_branch`)."""
    from ..training.resume import STABLE, STABLE_BEST

    kept = [folder / name for name in (STABLE, STABLE_BEST) if (folder / name).is_file()]
    if not kept:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in folder.iterdir():
        if path not in kept:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _drop_checkpoints(session: Session, number: int, resumable: Resumable | None) -> None:
    """Delete the checkpoints of a trial that failed or was pruned in a live worker: never continued."""
    if resumable is not None:
        run_ids = [resumable.run_id]
    else:
        runs = session.client.search_runs(
            [session.experiment_id], max_results=5,
            filter_string=f"{study_filter(session.name)} and tags.`{keys.TRIAL}` = '{number}'")
        run_ids = [run.info.run_id for run in runs]
    for run_id in run_ids:
        shutil.rmtree(checkpoint_dir(run_id, session.tracking_uri), ignore_errors=True)


def record_result(trial: optuna.Trial, result) -> None:
    """The run id and test scores on the trial, where `optuna trials` and the dashboard show them."""
    trial.set_user_attr(keys.TRIAL_RUN_ID, result.run_id)
    trial.set_user_attr(keys.TRIAL_EPOCHS, result.epochs)
    trial.set_user_attr(keys.TRIAL_STOPPED_BY, result.stopped_by)
    for year, scores in result.test_scores.items():
        for name, value in scores.as_dict(f"test_{year}").items():  # the run's metric names, prefixed
            trial.set_user_attr(keys.trial_score(name), value)


def run_one_trial(session: Session, objective: Callable[[optuna.Trial], float]) -> TrialState:
    """Run one trial of `objective` in this worker; its final state (FAIL when another worker failed it)."""
    numbers: list[int] = []

    def numbered(trial: optuna.Trial) -> float:
        numbers.append(trial.number)
        return objective(trial)

    session.bookings.vouch_for_live_workers()  # Optuna checks heartbeats as the trial starts
    try:
        session.study.optimize(numbered, n_trials=1, catch=(Exception,), gc_after_trial=True)
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
        # Another worker failed the trial while it ran (its heartbeat silent past the grace period): Optuna
        # refuses its next write (UpdateFinishedTrialError) and its final tell (ValueError). Others raise.
        if not numbers or not _stored(session, numbers[0]).state.is_finished():
            raise
        session.say(f"trial {numbers[0]}: was marked FAIL by another worker while it ran "
                    f"(no heartbeat for {GRACE_HEARTBEATS * heartbeat_s()} s); its result is not kept and its "
                    f"cell runs again")
        session.fail_dead_trial_runs()
        return TrialState.FAIL
    if not numbers:
        return TrialState.FAIL
    return _stored(session, numbers[0]).state


def _stored(session: Session, number: int) -> optuna.trial.FrozenTrial:
    """Trial `number` as the storage has it now."""
    return session.storage.get_trial(trial_id(session.storage, session.study, number))


_NOT_COPIED = (keys.STUDY, keys.TRIAL, keys.CELL, keys.VARIANT, keys.BASELINE, keys.RESUMED_FROM, keys.PID, keys.HOST)


@dataclass(frozen=True)
class TrainedRun:
    """A finished trial run of another study with the cell's config and seed."""

    run_id: str
    study: str  # its study's name
    best_val_exprate: float


def find_trained(client, cfg: Config, own_study: str) -> TrainedRun | None:
    """The earliest such run in the store (see the module), or None."""
    from ..training.fingerprint import code_fingerprint

    fingerprint = code_fingerprint()
    seed = str(cfg.train.seed)
    runs = search_all_runs(client, filter_string=f"attributes.status = 'FINISHED' and tags.`{keys.SEED}` = '{seed}'",
                           oldest_first=True)
    for run in runs:
        tags = run.data.tags
        study = tags.get(keys.STUDY)
        if not study or study == own_study or keys.TRIAL not in tags or keys.REUSED_FROM in tags:
            continue
        if tags.get(keys.FINGERPRINT) != fingerprint or keys.FINGERPRINT_CHANGED in tags:
            continue
        if "best_val_exprate" not in run.data.metrics:
            continue
        try:
            stored = load_run_json(client, run.info.run_id, "config.json")
        except Exception:  # noqa: BLE001 - a run without its config is not comparable
            continue
        if same_config(stored, cfg):
            return TrainedRun(run.info.run_id, study, run.data.metrics["best_val_exprate"])
    return None


def copy_run(client, source: TrainedRun, *, experiment_id: str, parent_run_id: str, run_name: str,
             tags: Mapping[str, str]) -> str:
    """A copy of `source` as a child run of `parent_run_id`, `tags` over its own; its id."""
    from mlflow.entities import Metric

    original = client.get_run(source.run_id)
    own = {k: v for k, v in original.data.tags.items() if not k.startswith("mlflow.") and k not in _NOT_COPIED}
    run = client.create_run(experiment_id, start_time=original.info.start_time, run_name=run_name, tags={
        **own, **tags, keys.REUSED_FROM: source.run_id, keys.MLFLOW_PARENT_RUN_ID: parent_run_id,
        keys.MLFLOW_NOTE: f"The same config and seed as run {source.run_id} of study {source.study}, "
                          f"copied instead of trained again (hmer.studies.objective)."})
    run_id = run.info.run_id
    log_params(client, run_id, original.data.params)
    log_batch(client, run_id, "metrics", [Metric(m.key, m.value, m.timestamp, m.step) for key in original.data.metrics
                                          for m in client.get_metric_history(source.run_id, key)])
    with tempfile.TemporaryDirectory(prefix="hmer-reuse-") as tmp:
        for name in list_run_artifacts(client, source.run_id):
            local = download_run_artifact(client, source.run_id, name, tmp)
            if os.path.isdir(local):
                client.log_artifacts(run_id, local, artifact_path=name)
            else:
                client.log_artifact(run_id, local)
    client.set_tag(run_id, keys.STATUS, "finished")
    client.set_terminated(run_id, status="FINISHED", end_time=original.info.end_time)
    return run_id

