"""The scores a run lacks, computed from the predictions it stored: `hmer runs rescore`.

A metric registered after a run was trained (the papers' lgeval measures, issue 56) is a function of
the predictions it stored (`artifacts.predictions_artifact`): the run is given every registered one
it lacks, under the key it would have logged (`test_2014_lgeval_le1`), at the split's scores' step.

Planning writes nothing (a dry run plans only), so a bad input stops before the store changes. A
metric a run has is never logged again; a split whose predictions do not give its logged scores is
left, the plan saying why.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..evaluation.metrics import expression_metrics
from ..registry import METRICS
from . import keys
from .store import search_all_runs, study_filter
from .artifacts import PREDICTIONS, SPLIT, read_predictions_csv, scored_key
from .portable import download_run_artifact, list_run_artifacts
from .run import process_gone

# The split's score every run logs with its predictions: what the stored file is checked against, and
# whose step the new scores take. `<key>_n`, where logged, must be the file's count of expressions.
ANCHOR = "exprate"
UP_TO_DATE = "every registered metric logged already"


class UnreadablePredictions(ValueError):
    """A stored predictions file that cannot be read as one: one line naming the run and the file."""


@dataclass
class RunPlan:
    """What rescoring adds to one run: `added` {metric key: (value, step)}, the splits `left` as they
    are {split key: why}, and `why` nothing is added at all ("" when something is)."""

    run_id: str
    label: str  # the run in words: its study, variant and seed, or its name
    study: str  # its study (tag hmer.study), "" for a run of none
    added: dict[str, tuple[float, int]] = field(default_factory=dict)
    scored: dict[str, list[str]] = field(default_factory=dict)  # {split key: the metrics added to it}
    left: dict[str, str] = field(default_factory=dict)
    why: str = ""

    def describe(self) -> str:
        """The metrics added, in words: "lgeval_le1, lgeval_le2 of test_2014, val_final"."""
        splits: dict[tuple[str, ...], list[str]] = {}  # the splits given each list of metrics
        for key, names in self.scored.items():
            splits.setdefault(tuple(names), []).append(key)
        return "; ".join(f"{', '.join(names)} of {', '.join(of)}" for names, of in splits.items())


def select_runs(client, run_ids: Sequence[str] = (), studies: Sequence[str] = ()) -> list[Any]:
    """The runs `run_ids` (whole ids), then those of `studies` (`hmer.study`), each once; all runs when
    neither is given. ValueError names a run or study the store lacks."""
    from mlflow.exceptions import MlflowException

    runs: dict[str, Any] = {}
    for run_id in run_ids:
        try:
            runs.setdefault(run_id, client.get_run(run_id))
        except MlflowException:
            raise ValueError(f"run {run_id}: no such run in {client.tracking_uri}") from None
    for study in studies:
        found = search_all_runs(client, filter_string=study_filter(study), oldest_first=True)
        if not found:
            raise ValueError(f"study {study!r}: no run in {client.tracking_uri} is tagged {keys.STUDY}={study}")
        for run in found:
            runs.setdefault(run.info.run_id, run)
    if not run_ids and not studies:
        runs = {run.info.run_id: run for run in search_all_runs(client, oldest_first=True)}
    return list(runs.values())


def plan_rescoring(client, runs: Sequence[Any]) -> list[RunPlan]:
    """A plan per run, in order; writes nothing. UnreadablePredictions for a file that is not one."""
    with tempfile.TemporaryDirectory(prefix="hmer-rescore-") as tmp:
        return [_plan(client, run, Path(tmp)) for run in runs]


def _plan(client, run, tmp: Path) -> RunPlan:
    tags, metrics = run.data.tags, run.data.metrics
    plan = RunPlan(run.info.run_id, _label(run), tags.get(keys.STUDY) or "")
    if tags.get(keys.ROLE):
        plan.why = f"a study's own run ({keys.ROLE}={tags[keys.ROLE]}), not a training run: no predictions"
        return plan
    # A run whose process is gone (RUNNING until resumed) is scored as an ended one.
    if run.info.status == "RUNNING" and process_gone(tags) is None:
        plan.why = ("still running: rescore it once it has ended (its final evaluation logs the metrics "
                    "its own code registers)")
        return plan
    stored = {key: f"{folder}/{name}" for folder in (PREDICTIONS, SPLIT)
              for name in list_run_artifacts(client, run.info.run_id, folder)
              if (key := scored_key(f"{folder}/{name}")) is not None}
    if not stored:
        plan.why = f"no stored predictions ({tags.get(keys.STATUS) or run.info.status.lower()})"
        return plan
    for key, artifact in sorted(stored.items()):
        lacking = [name for name in METRICS.names() if f"{key}_{name}" not in metrics]
        if not lacking:
            continue
        anchor = f"{key}_{ANCHOR}"
        if anchor not in metrics:
            plan.left[key] = f"no {anchor} was logged from {artifact}: it scored nothing"
            continue
        folder = tmp / run.info.run_id
        folder.mkdir(exist_ok=True)
        local = download_run_artifact(client, run.info.run_id, artifact, str(folder))
        try:
            rows = read_predictions_csv(local)
        except ValueError as exc:
            raise UnreadablePredictions(f"run {run.info.run_id} ({plan.label}), {artifact}: "
                                        f"{str(exc).removeprefix(f'{local}: ')}") from None
        scores = expression_metrics([row["prediction"].split() for row in rows], [row["truth"].split() for row in rows])
        logged_n = metrics.get(f"{key}_n")
        if logged_n is not None and int(logged_n) != scores.n:
            plan.left[key] = f"{artifact} holds {scores.n} expressions where {key}_n is {int(logged_n)}"
            continue
        if not math.isclose(scores.exprate, metrics[anchor], abs_tol=1e-6):
            plan.left[key] = f"{artifact} reads {scores.exprate:.4f} % exactly where {anchor} is {metrics[anchor]:.4f}"
            continue
        # the step of the anchor's latest value, as MLflow picks it: the largest step, then the latest time
        history = client.get_metric_history(run.info.run_id, anchor)
        step = max(history, key=lambda m: (m.step, m.timestamp)).step if history else 0
        values = scores.as_dict(key)
        plan.added.update({f"{key}_{name}": (float(values[f"{key}_{name}"]), step) for name in lacking})
        plan.scored[key] = lacking
    if not plan.added:
        plan.why = "; ".join(f"{key}: {why}" for key, why in plan.left.items()) or UP_TO_DATE
    return plan


def _label(run) -> str:
    tags = run.data.tags
    study, variant, seed = tags.get(keys.STUDY), tags.get(keys.VARIANT), tags.get(keys.SEED)
    if study:
        return " ".join(x for x in (study, variant, f"seed {seed}" if seed else "") if x)
    return run.info.run_name or variant or "no name"


def write_rescoring(client, plans: Sequence[RunPlan]) -> int:
    """Log each plan's added metrics into its run, timestamped now; returns how many were logged."""
    from mlflow.entities import Metric

    from ..signals import deferred
    from .run import log_batch

    now = int(time.time() * 1000)
    logged = 0
    for plan in plans:
        if plan.added:
            with deferred():  # a SIGTERM waits for the run's metrics: each run is rescored whole or not at all
                log_batch(client, plan.run_id, "metrics", [Metric(key, value, now, step)
                                                           for key, (value, step) in plan.added.items()])
            logged += len(plan.added)
    return logged
