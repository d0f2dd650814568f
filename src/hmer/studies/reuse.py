"""A grid cell that another study has already trained is copied, not trained again.

Studies share cells (the decoder study's transformer cell is the direction study's bi cell at one
budget). `find_trained` looks for a FINISHED trial run of another study whose `config.json` is the
cell's (`resume.same_config`), with its seed, trained by code of this code's fingerprint
(`hmer.training.fingerprint`) and never resumed under other code: the same config is not the same
computation otherwise. `copy_run` makes it a child run of this study's parent, with its params, metric
histories, artifacts and times, tagged `hmer.reused_from`. Copies count no cost
(`mlflow_runs.measured_cost`); `--train-every-cell` (`reuse=False`) trains every cell.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Mapping

from ..config import Config
from ..tracking import keys
from ..tracking.portable import download_run_artifact, list_run_artifacts, load_run_json
from ..tracking.store import search_all_runs
from .resume import same_config

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

    from ..tracking.run import log_metric_points, log_params

    original = client.get_run(source.run_id)
    own = {k: v for k, v in original.data.tags.items() if not k.startswith("mlflow.") and k not in _NOT_COPIED}
    run = client.create_run(experiment_id, start_time=original.info.start_time, run_name=run_name, tags={
        **own, **tags, keys.REUSED_FROM: source.run_id, keys.MLFLOW_PARENT_RUN_ID: parent_run_id,
        keys.MLFLOW_NOTE: f"The same config and seed as run {source.run_id} of study {source.study}, "
                          f"copied instead of trained again (hmer.studies.reuse)."})
    run_id = run.info.run_id
    log_params(client, run_id, original.data.params)
    log_metric_points(client, run_id, [Metric(m.key, m.value, m.timestamp, m.step) for key in original.data.metrics
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


def trial_attrs(client, run_id: str) -> dict[str, float | int | str]:
    """What `objective.record_result` puts on a trial, read from the copied run (its epochs: the last step
    of its training loss)."""
    metrics = client.get_run(run_id).data.metrics
    epochs = max((m.step for m in client.get_metric_history(run_id, "train_loss")), default=0)
    return {keys.TRIAL_RUN_ID: run_id, keys.TRIAL_EPOCHS: int(epochs), keys.TRIAL_STOPPED_BY: "epochs",
            **{keys.trial_score(k): v for k, v in metrics.items() if k.startswith("test_")}}
