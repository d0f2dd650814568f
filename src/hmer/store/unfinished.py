"""Unfinished studies in a published store: left out, or kept to be continued.

An unfinished study has no answer yet, so the published copy keeps only the finished (and superseded)
studies; the others are purged from the copy (`mlflow gc`, the Optuna study), not from the workspace.
`--keep-unfinished` keeps them with the smallest files that continue each cell from a workspace made
from the commit (every committed file stays in history): the run its next trial continues, `last.pt`,
and `best.pt` only where the best weights are not last.pt's.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from ..tracking import keys
from ..tracking.portable import CHECKPOINTS
from ..tracking.store import search_all_runs

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
    import optuna
    from optuna.trial import TrialState

    from ..studies.mlflow_runs import trial_runs
    from ..studies.resume import dead_trial_runs

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
    import optuna

    from ..tracking.store import mlflow_client

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
