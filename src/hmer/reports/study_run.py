"""A study's table where the study lives: on its MLflow parent run, for the MLflow UI.

    changes = annotate_study("ablate_direction-cpu", tracking_uri)   # [] when already up to date

The parent run of a grid study gets
- its table as the run's description (tag `mlflow.note.content`, Markdown: the rows `hmer report`
  prints, which the UI shows on the run's page) and as the artifact `table.md`;
- per-variant summary metrics, `test_<year>_exprate_mean/<variant>` and `..._std/<variant>`
  (percent, over seeds), so that the parent's row in the runs table and the chart view, whose
  sections group metrics by the part before "/", compare the variants without opening the trials.

A sweep's parent run gets its table as a sweep prints it (`hmer.studies.sweeps.sweep_table`: every
trial with its objective and parameters), as its description and `table.md`; a study superseded
by another (`hmer runs supersede`) gets its table as it stopped, finished or not.

Only what differs from the stored values is written, so annotating a study again (a finished
study resumed, a store published twice) leaves the store byte for byte as it was.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from ..tracking import keys
from .runs import client_for, list_studies, resolve_tracking_uri, study_parent
from .table_format import format_table
from .tables import study_table

TABLE_ARTIFACT = "table.md"
SUMMARY_STATS = ("mean", "std")
_METRIC_UNSAFE = re.compile(r"[^\w.\- :]")  # MLflow's metric names: letters, digits, _ - . space : /


def summary_metric(year: str, stat: str, variant: str) -> str:
    """`test_2014_exprate_mean/bi`: a variant's summary over seeds, in the section of its year and
    statistic ("/" inside a variant label, rnn/l2r, becomes "-")."""
    label = _METRIC_UNSAFE.sub("_", str(variant).replace("/", "-"))
    return f"test_{year}_exprate_{stat}/{label}"


def summary_metrics(table: pd.DataFrame) -> dict[str, float]:
    """Mean and std over seeds of each year's ExpRate per variant (%), from a `study_table`; a
    number the table lacks (the std of one seed, a year not scored) is left out."""
    metrics: dict[str, float] = {}
    for variant, row in table.iterrows():
        for year in table.attrs.get("years", []):
            for stat in SUMMARY_STATS:
                value = row.get(f"{year}_exprate_{stat}")
                if value is not None and not pd.isna(value):
                    metrics[summary_metric(str(year), stat, str(variant))] = float(value)
    return metrics


def description(study: str, table: pd.DataFrame) -> str:
    """The parent run's description: the study's table as `hmer report --study` prints it, in Markdown."""
    return (f"{format_table(table, 'markdown')}\n"
            f"`hmer report --study {study}` prints this table and writes its plots; the trials are this "
            f"run's child runs (group them by the tag `{keys.VARIANT}`). The summary metrics "
            f"`test_<year>_exprate_mean/<variant>` and `_std` are percent over seeds.\n")


def annotate_study(study: str, tracking_uri: str | None = None, table: pd.DataFrame | None = None) -> list[str]:
    """Write the study's table and summary metrics onto its parent run (see the module docstring),
    only where they differ from what is stored; returns what was written, in words."""
    uri = resolve_tracking_uri(tracking_uri)
    parent = study_parent(study, uri)
    if parent is None:
        return []
    table = study_table(study, uri) if table is None else table
    if table.empty:
        return []
    from mlflow.exceptions import MlflowException

    client = client_for(uri)
    # Two workers of a study can finish at the same moment and both annotate its parent. MLflow's
    # SQLite store inserts a new tag or metric point without a lock, so the second insert fails on
    # a unique key; what the first wrote is then there, and a second pass writes only what differs.
    try:
        return _annotate(client, parent["run_id"], study, table)
    except MlflowException:
        return _annotate(client, parent["run_id"], study, table)


def _annotate(client, run_id: str, study: str, table: pd.DataFrame) -> list[str]:
    return _write_annotation(client, run_id, description(study, table), format_table(table, "markdown"),
                             summary_metrics(table))


def _write_annotation(client, run_id: str, note: str, table_md: str, metrics: dict[str, float]) -> list[str]:
    """The parent run's description `note`, its `table.md` and summary `metrics`, each written where
    it differs from what is stored; returns what was written, in words."""
    from mlflow.entities import Metric

    run = client.get_run(run_id)
    changes: list[str] = []
    if run.data.tags.get(keys.MLFLOW_NOTE) != note:
        client.set_tag(run.info.run_id, keys.MLFLOW_NOTE, note)
        changes.append("description")
    stale = {k: v for k, v in metrics.items() if not _same(run.data.metrics.get(k), v)}
    if stale:
        when = _millis(run)
        client.log_batch(run.info.run_id, metrics=[Metric(k, v, when, 0) for k, v in sorted(stale.items())])
        changes.append(f"{len(stale)} summary metrics")
    if _write_artifact_if_changed(client, run, TABLE_ARTIFACT, table_md):
        changes.append(TABLE_ARTIFACT)
    return changes


def annotate_sweep(study: str, tracking_uri: str | None = None, storage: str | None = None) -> list[str]:
    """Write the sweep's table (`sweep_table`, read from its Optuna storage: by default optuna.db
    beside the MLflow store) onto its parent run, where it differs; returns what was written."""
    import optuna

    from ..studies.sweeps import sweep_table
    from .sweep import sweep_storage

    uri = resolve_tracking_uri(tracking_uri)
    parent = study_parent(study, uri)
    if parent is None:
        return []
    text = sweep_table(optuna.load_study(study_name=study, storage=sweep_storage(uri, storage)))
    table_md = f"```\n{text}\n```\n"
    return _write_annotation(client_for(uri), parent["run_id"], sweep_description(study, text), table_md, {})


NOTE_CHARS = 6000  # a description longer than MLflow's 8000-character tag limit would be cut off


def sweep_description(study: str, text: str) -> str:
    """The sweep's parent-run description: its table (`sweep_table`'s text, best trials first) as
    far as it fits a description, the whole of it being `table.md`."""
    lines = text.splitlines()
    header, rows = lines[:2], [line for line in lines[2:] if line.startswith(" ") or line[:1].isdigit()]
    shown = []
    for row in rows:
        if sum(len(line) + 1 for line in header + shown + [row]) > NOTE_CHARS:
            break
        shown.append(row)
    cut = (f"the best {len(shown)} of {len(rows)} trials here, every trial in {TABLE_ARTIFACT}; "
           if len(shown) < len(rows) else "")
    block = "\n".join(header + shown)
    return (f"```\n{block}\n```\n\n{cut}its trials are this run's child runs; notebooks/sweep.ipynb plots the "
            f"sweep {study}.\n")


def annotate_studies(tracking_uri: str | None = None) -> dict[str, list[str]]:
    """The table of every study of the store that has one to show onto its parent run: every
    finished grid study and sweep, and every superseded grid study as it stopped. {study: what
    was written}."""
    uri = resolve_tracking_uri(tracking_uri)
    studies = list_studies(uri)
    done: dict[str, list[str]] = {}
    for _, row in studies.iterrows():
        finished = str(row["state"]).lower() == "finished"
        superseded = isinstance(row["superseded_by"], str) and bool(row["superseded_by"])
        if row["kind"] == "grid" and (finished or superseded):
            done[str(row["study"])] = annotate_study(str(row["study"]), uri)
        elif row["kind"] == "sweep" and finished:
            done[str(row["study"])] = annotate_sweep(str(row["study"]), uri)
    return done


def _same(stored: Any, value: float) -> bool:
    return stored is not None and math.isclose(float(stored), value, rel_tol=1e-12, abs_tol=1e-12)


def _millis(run) -> int:
    """The summary's timestamp: the run's end (or start), so that annotating is reproducible."""
    return int(run.info.end_time or run.info.start_time or 0)


def _write_artifact_if_changed(client, run, name: str, text: str) -> bool:
    """Write the text artifact `name` of `run` unless it holds `text` already. A store made portable
    (relative artifact locations, `tracking.portable`) is written where its files lie."""
    from ..atomic import write_text_atomically
    from ..tracking.portable import resolve_artifact_uri

    root = resolve_artifact_uri(run.info.artifact_uri, client.tracking_uri)
    if root.startswith("file:") or root.startswith("/"):
        from urllib.parse import unquote, urlparse

        path = Path(unquote(urlparse(root).path) if root.startswith("file:") else root) / name
        if path.is_file() and path.read_text() == text:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, text)
        return True
    import mlflow.artifacts

    try:
        if mlflow.artifacts.load_text(f"{root}/{name}") == text:
            return False
    except Exception:  # noqa: BLE001 - not there yet
        pass
    client.log_text(run.info.run_id, text, name)
    return True
