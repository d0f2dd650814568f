"""Runs out of MLflow, as typed pandas frames: the input of every table and plot.

`load_runs` gives `mlflow.search_runs`' columns plus `experiment`, `run_name`, `variant` (tag
`hmer.variant`), `seed`, `trial` and `state` (tag `hmer.status`, else MLflow's status), params parsed
back to their types (a config key to its `Config` field's type, any other to an int, float or bool when
it is one). It searches with an `MlflowClient` bound to the store: `mlflow.search_runs`
would change the process-wide tracking URI (and child processes'). `CorrectnessCache` lines up which test
expressions each run read right (same expressions, same order) for the paired tests of
`hmer.evaluation.significance`.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from contextlib import contextmanager
from functools import lru_cache, reduce
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, get_type_hints

import numpy as np
import pandas as pd

from ..tracking import keys
from ..tracking.store import default_tracking_uri, mlflow_client, search_all_runs, study_filter
from ..config import SECTIONS
from ..registry import METRICS

STUDY_ROLES = (keys.ROLE_STUDY, keys.ROLE_SUMMARY)  # a study's own runs, beside its trials
EPOCH_METRICS = ("val_exprate", "val_loss", "train_loss", "lr", "images_per_second", "epoch_seconds",
                 "train_cpu_seconds")
# a year, or the standard 2014 images (2014-std, `hmer evaluate --standard-2014 --log`)
_YEAR_METRIC = re.compile(r"^metrics\.test_(?P<year>\d{4}(?:-std)?)_exprate$")


class NoRunsError(ValueError):
    """Nothing in the store matches (unknown study, experiment or run)."""


class PredictionsNotFound(LookupError):
    """A run has no `predictions/test_{year}.csv` artifact."""


# ---- params ---------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def config_types() -> dict[str, type]:
    """{dotted config key: its Python type}, e.g. {"train.lr": float}."""
    return {"name": str, **{f"{section}.{key}": typ for section, cls in SECTIONS.items()
                            for key, typ in get_type_hints(cls).items()}}


_BOOLS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
# how a param string is read as a number: any as an int, else a float; an int also as "1e3"
_CASTS: dict[Any, tuple] = {None: (int, float), int: (int, lambda text: int(float(text))), float: (float,)}


def parse_value(text: Any, typ: type | None = None) -> Any:
    """One param string as `typ` (inferred when None); unparseable stays a string: an old run may hold
    a value a newer Config refuses, and a report must still load it."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    if not isinstance(text, str) or typ is str:
        return text
    low = text.strip().lower()
    if typ is bool or (typ is None and low in ("true", "false")):
        return _BOOLS.get(low, text)
    for cast in _CASTS.get(typ, ()):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def typed_column(values: Iterable[Any]) -> pd.Series:
    """Parsed values with a fitting (nullable) dtype."""
    series = pd.Series(list(values), dtype=object)
    present = series.dropna()
    if present.empty:
        return series
    kinds = {type(v) for v in present}
    if kinds == {bool}:
        return series.astype("boolean")
    if kinds == {int}:
        return series.astype("Int64")
    if kinds <= {int, float}:
        return series.astype("float64")
    return series


# ---- the store --------------------------------------------------------------------------------

def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    return tracking_uri or default_tracking_uri()


# ---- runs -----------------------------------------------------------------------------------------

def _experiment_ids(client, experiment: str | None) -> tuple[list[str], dict[str, str]]:
    from mlflow.entities import ViewType

    names = {e.experiment_id: e.name for e in client.search_experiments(view_type=ViewType.ALL)}
    if experiment is None:
        return list(names), names
    found = [eid for eid, name in names.items() if name == experiment or eid == experiment]
    if not found:
        known = ", ".join(sorted(names.values())) or "none"
        raise NoRunsError(f"no MLflow experiment {experiment!r} in the store (experiments: {known})")
    return found, names


def runs_frame(runs: Sequence[Any], experiment_names: dict[str, str] | None = None) -> pd.DataFrame:
    """MLflow `Run` objects as the module docstring's frame."""
    types = config_types()
    rows: list[dict[str, Any]] = []
    for run in runs:
        info, data = run.info, run.data
        rows.append({
            "run_id": info.run_id, "experiment_id": info.experiment_id,
            "experiment": (experiment_names or {}).get(info.experiment_id, info.experiment_id),
            "run_name": info.run_name, "status": info.status,
            "start_time": pd.to_datetime(info.start_time, unit="ms", utc=True) if info.start_time else pd.NaT,
            "end_time": pd.to_datetime(info.end_time, unit="ms", utc=True) if info.end_time else pd.NaT,
            "artifact_uri": info.artifact_uri, **{f"metrics.{k}": float(v) for k, v in data.metrics.items()},
            **{f"params.{k}": v for k, v in data.params.items()}, **{f"tags.{k}": v for k, v in data.tags.items()},
        })
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["run_id", "experiment_id", "experiment", "run_name", "status", "start_time",
                                     "end_time", "artifact_uri", "variant", "seed", "trial", "state"])
    for col in [c for c in df.columns if c.startswith("params.")]:
        df[col] = typed_column(parse_value(v, types.get(col.removeprefix("params."))) for v in df[col])
    df["variant"] = [_variant(r) for r in df.to_dict("records")]
    df["seed"] = typed_column(_seed(r) for r in df.to_dict("records"))
    df["variant"] = _distinct_standalone_runs(df)
    trial = df.get(f"tags.{keys.TRIAL}", pd.Series([None] * len(df)))
    df["trial"] = typed_column(parse_value(v, int) for v in trial)
    status_tag = df.get(f"tags.{keys.STATUS}", pd.Series([None] * len(df)))
    df["state"] = [str(t) if isinstance(t, str) and t else str(s).lower() for t, s in zip(status_tag, df["status"])]
    return df.reset_index(drop=True)


def _variant(row: dict[str, Any]) -> str:
    for key in (f"tags.{keys.VARIANT}", "params.name", "run_name"):
        value = row.get(key)
        if isinstance(value, str) and value:
            return value
    return str(row["run_id"])[:8]


def _distinct_standalone_runs(df: pd.DataFrame) -> pd.Series:
    """The variant column, runs outside a study sharing a variant and seed told apart by run name:
    they are recipes of one preset (a retrain beside the model it improves on), not seeds."""
    variant = df["variant"].copy()
    study = df.get(f"tags.{keys.STUDY}", pd.Series([None] * len(df), index=df.index))
    alone = study.isna() | (study == "")
    key = variant.astype(str) + "\0" + df["seed"].astype(str)
    shared = alone & key.map(key[alone].value_counts()).gt(1)
    names = df["run_name"].where(df["run_name"].astype(bool) & df["run_name"].notna(), df["run_id"].str[:8])
    variant[shared] = names[shared]
    return variant


def _seed(row: dict[str, Any]) -> int | None:
    for key in (f"tags.{keys.SEED}", "params.train.seed"):
        value = parse_value(row.get(key), int)
        if isinstance(value, int):
            return value
    return None


def load_runs(tracking_uri: str | None = None, experiment: str | None = None, study: str | None = None,
              run_ids: Sequence[str] | None = None, *, include_parents: bool = False) -> pd.DataFrame:
    """Runs of a study (tag `hmer.study`), an experiment (name or id), run ids (`NoRunsError` for an
    unknown one) or the whole store, oldest first; a study's parent and summary runs (`hmer.role`)
    only with `include_parents`."""
    client = mlflow_client(tracking_uri)
    if run_ids:
        from mlflow.exceptions import MlflowException

        names = {e.experiment_id: e.name for e in client.search_experiments()}
        found = []
        for run_id in run_ids:
            try:
                found.append(client.get_run(run_id))
            except MlflowException:
                raise NoRunsError(f"no run {run_id!r} in the MLflow store {resolve_tracking_uri(tracking_uri)}") \
                    from None
        df = runs_frame(found, names)
    else:
        ids, names = _experiment_ids(client, experiment)
        where = study_filter(study) if study else ""
        df = runs_frame(search_all_runs(client, ids, where, oldest_first=True) if ids else [], names)
    if not include_parents and not df.empty and f"tags.{keys.ROLE}" in df.columns:
        df = df[~df[f"tags.{keys.ROLE}"].isin(STUDY_ROLES)].reset_index(drop=True)
    return df


def study_parent(study: str, tracking_uri: str | None = None) -> pd.Series | None:
    """A study's parent run (tag `hmer.role=study`) as a `load_runs` row, or None."""
    runs = load_runs(tracking_uri, study=study, include_parents=True)
    parents = runs[runs.get(f"tags.{keys.ROLE}", pd.Series("", index=runs.index)) == keys.ROLE_STUDY]
    return None if parents.empty else parents.iloc[0]


def study_budget(head: pd.Series) -> str | None:
    """A study's budget from its parent's row (param `budget`) or a trial's (tag keys.BUDGET)."""
    for column in ("params.budget", f"tags.{keys.BUDGET}"):
        value = head.get(column)
        if isinstance(value, str) and value:
            return value
    return None


def study_progress(study: str, tracking_uri: str | None = None) -> str | None:
    """How far an unfinished study is: "in progress, 4 of 9 trials finished"; else None."""
    runs = load_runs(tracking_uri, study=study, include_parents=True)
    role = runs.get(f"tags.{keys.ROLE}", pd.Series("", index=runs.index))
    parent = runs[role == keys.ROLE_STUDY]
    if parent.empty or parent.iloc[0]["state"] == "finished":
        return None
    trials = runs[~role.isin(STUDY_ROLES)]
    try:
        of = f" of {int(parent.iloc[0].get('params.n_trials'))}"  # a grid's cells, the trials a sweep aims for
    except (TypeError, ValueError):
        of = ""
    return f"in progress, {int((trials['state'] == 'finished').sum())}{of} trials finished"


def list_studies(tracking_uri: str | None = None) -> pd.DataFrame:
    """Every study in the store, newest first; `trials` counts runs by state ("6 finished, 2 failed")."""
    runs = load_runs(tracking_uri, include_parents=True)
    columns = ["study", "experiment", "kind", "budget", "state", "superseded_by", "runs", "trials", "started"]
    if runs.empty or f"tags.{keys.STUDY}" not in runs.columns:
        return pd.DataFrame(columns=columns)
    runs = runs[runs[f"tags.{keys.STUDY}"].notna()]
    role = runs.get(f"tags.{keys.ROLE}", pd.Series("", index=runs.index)).fillna("")
    rows = []
    for name, group in runs.groupby(f"tags.{keys.STUDY}", sort=False):
        parent = group[role.loc[group.index] == keys.ROLE_STUDY]
        head = parent.iloc[0] if not parent.empty else group.iloc[0]
        trials = ~role.loc[group.index].isin(STUDY_ROLES)
        states = group.loc[trials, "state"].value_counts()
        rows.append({
            "study": name,
            "experiment": head["experiment"],
            "kind": head.get(f"tags.{keys.KIND}") if not parent.empty else None,
            "budget": study_budget(head),
            "state": head["state"] if not parent.empty else None,
            "superseded_by": head.get(f"tags.{keys.SUPERSEDED_BY}") if not parent.empty else None,
            "runs": int(trials.sum()),
            "trials": ", ".join(f"{n} {state}" for state, n in states.items()) or "none",
            # the parent run's start: a study's trials may be copies of older runs (hmer.studies.objective.copy_run)
            "started": head["start_time"] if not parent.empty else group["start_time"].min(),
        })
    return pd.DataFrame(rows, columns=columns).sort_values("started", ascending=False).reset_index(drop=True)


def scored_years(runs: pd.DataFrame) -> list[str]:
    return sorted({m.group("year") for c in runs.columns if (m := _YEAR_METRIC.match(str(c)))})


# ---- histories and predictions ------------------------------------------------------------------

def curve_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs whose curves are worth drawing: not failed ones (a few points bend the mean) nor
    killed attempts trained again (`hmer.trained_again_in`: counted twice); pruned and running stay."""
    if "state" in runs.columns:
        runs = runs[runs["state"] != "failed"]
    again = f"tags.{keys.TRAINED_AGAIN_IN}"
    return runs[runs[again].isna()] if again in runs.columns else runs


def load_history(run_ids: Sequence[str] | pd.DataFrame, metrics: Sequence[str] = EPOCH_METRICS,
                 tracking_uri: str | None = None) -> pd.DataFrame:
    """One row per (run, metric, step) logged, `seconds` from the run's start; a `load_runs` frame's
    `variant` and `seed` are joined in."""
    runs = run_ids if isinstance(run_ids, pd.DataFrame) else None
    ids = list(runs["run_id"]) if runs is not None else list(run_ids)
    client = mlflow_client(tracking_uri)
    rows: list[dict[str, Any]] = []
    for run_id in ids:
        start = client.get_run(run_id).info.start_time
        for key in metrics:
            for point in client.get_metric_history(run_id, key):
                rows.append({"run_id": run_id, "metric": key, "step": int(point.step), "value": float(point.value),
                             "timestamp": pd.to_datetime(point.timestamp, unit="ms", utc=True),
                             "seconds": (point.timestamp - start) / 1000.0 if start else math.nan})
    history = pd.DataFrame(rows, columns=["run_id", "metric", "step", "value", "timestamp", "seconds"])
    history = history.sort_values(["run_id", "metric", "step", "timestamp"]).reset_index(drop=True)
    if runs is not None:
        extra = [c for c in ("variant", "seed") if c in runs.columns]
        history = history.merge(runs[["run_id", *extra]], on="run_id", how="left")
    return history


@contextmanager
def _quiet_downloads() -> Iterator[None]:
    """No MLflow progress bar per file (a table fetches a CSV per run and year)."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    mine = key not in os.environ  # else the user's own choice, kept
    os.environ.setdefault(key, "false")
    try:
        yield
    finally:
        if mine:
            os.environ.pop(key, None)


def load_predictions(run_id: str, year: str | int, tracking_uri: str | None = None) -> pd.DataFrame:
    """The run's `predictions/test_{year}.csv` with a `correct` column."""
    from mlflow.exceptions import MlflowException

    from ..tracking.portable import download_run_artifact

    client = mlflow_client(tracking_uri)
    artifact = f"predictions/test_{year}.csv"
    with tempfile.TemporaryDirectory(prefix="hmer-report-") as tmp, _quiet_downloads():
        try:
            local = download_run_artifact(client, run_id, artifact, tmp)
        except (MlflowException, OSError) as exc:
            raise PredictionsNotFound(f"run {run_id} has no {artifact} ({type(exc).__name__})") from None
        df = pd.read_csv(Path(local), dtype={"name": str, "truth": str, "prediction": str}, keep_default_na=False)
    missing = {"name", "truth", "prediction", "distance"} - set(df.columns)
    if missing:
        raise PredictionsNotFound(f"run {run_id}: {artifact} lacks the column(s) {', '.join(sorted(missing))}")
    df["distance"] = pd.to_numeric(df["distance"], errors="coerce").astype("Int64")
    df["correct"] = (df["distance"] == 0).fillna(False).astype(bool)
    return df


# (run_id, year) -> a frame with the columns name, correct and (for a metric other than exprate)
# distance, e.g. a bound `load_predictions`
PredictionLoader = Callable[[str, str], pd.DataFrame]


class CorrectnessCache:
    """Per-run correctness per year, each artifact fetched once; right is `metric`'s verdict."""

    def __init__(self, loader: PredictionLoader | None, metric: str = "exprate"):
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        self.loader = loader
        self.metric_name = metric
        self.metric = METRICS.get(metric)
        self.cache: dict[tuple[str, str], pd.Series | None] = {}
        self.used = False  # whether any pair of runs was aligned: the table carries tests

    def get(self, run_id: str, year: str) -> pd.Series | None:
        """{expression name: read right} of one run and year; None without the artifact."""
        if self.loader is None:
            return None
        key = (run_id, year)
        if key not in self.cache:
            try:
                df = self.loader(run_id, year)
                if self.metric_name == "exprate":
                    right = pd.Series(df["correct"].to_numpy(bool), index=df["name"].astype(str))
                else:
                    # A metric judging the tokens (lgeval) gives NaN where it does not score: unpaired.
                    distances = pd.to_numeric(df["distance"], errors="coerce").to_numpy(float)
                    verdicts = self.metric.verdicts(distances) if getattr(self.metric, "judge", None) is None else \
                        self.metric.verdicts(distances, [str(p).split() for p in df["prediction"]],
                                             [str(t).split() for t in df["truth"]])
                    right = pd.Series(verdicts, index=df["name"].astype(str)).dropna().astype(bool)
                self.cache[key] = right
            except PredictionsNotFound:
                self.cache[key] = None
        return self.cache[key]

    def aligned(self, base_runs: pd.DataFrame, runs: pd.DataFrame, year: str):
        """((baseline [seeds, n], seeds), (variant [seeds, n], seeds)) on the shared expressions, or None."""
        sides = []
        for frame in (base_runs, runs):
            series, seeds = [], []
            for i, (run_id, seed) in enumerate(zip(frame["run_id"], frame.get("seed", [None] * len(frame)))):
                s = self.get(run_id, year)
                if s is not None:
                    series.append(s)
                    seeds.append(int(seed) if seed is not None and not pd.isna(seed) else i)
            if not series:
                return None
            sides.append((series, seeds))
        names = reduce(pd.Index.intersection, (s.index for series, _ in sides for s in series)).sort_values()
        if len(names) == 0:
            return None
        self.used = True
        return tuple((np.stack([s[~s.index.duplicated()].reindex(names).to_numpy(bool) for s in series]), seeds)
                     for series, seeds in sides)
