"""A study at a glance where it lives: on its MLflow parent run, and in one run per variant beside it.

A grid study's parent run gets the artifacts `exprate.png` and `table.md`, and a description
(`mlflow.note.content`) with both. Beside the trials, one **summary run** per variant
(`hmer.role=summary`, "bi: mean of 3 seeds") logs `<year> ExpRate`, the mean over seeds: MLflow's
charts draw a bar per run, so these charts, sorted first, draw one per variant. A variant's runs
share its figure's colour (`mlflow.runColor`).

Only what differs is written, so annotating again leaves the store byte for byte; the figure is drawn
again only when missing or the table changed (matplotlib's pixels differ from machine to machine).
"""

from __future__ import annotations

import io
import math
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pandas as pd
from mlflow.entities import Metric

from ..atomic import FIGURE_DPI, write_atomically
from ..tracking import keys
from ..tracking.portable import download_run_artifact, resolve_artifact_uri
from ..tracking.store import mlflow_client, search_all_runs, study_filter
from ..reports.plots import plot_exprate, variant_colors
from ..reports.runs import load_runs, resolve_tracking_uri, scored_years, study_parent
from ..reports.tables import format_table, scored, study_table

TABLE_ARTIFACT = "table.md"
FIGURE_ARTIFACT = "exprate.png"
FIGURE_WIDTH_PX = 800  # the figure fits the run page's description at its natural size (MLflow does not scale it)


def summary_metric(year: str) -> str:
    """`2014 ExpRate`: a summary run's metric, its variant's mean ExpRate over seeds on that year (%)."""
    return f"{year} ExpRate"


def summary_run_name(variant: str, seeds: int) -> str:
    return f"{variant}: mean of {seeds} seed{'s' if seeds != 1 else ''}"


def summary_values(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{variant: {summary metric: mean ExpRate}} from a `study_table`, for each variant and year scored."""
    values: dict[str, dict[str, float]] = {}
    for variant, row in table.iterrows():
        if int(row.get("seeds", 0) or 0) < 1:
            continue
        metrics = {summary_metric(str(year)): float(row[f"{year}_exprate_mean"])
                   for year in table.attrs.get("years", [])
                   if not pd.isna(row.get(f"{year}_exprate_mean", math.nan))}
        if metrics:
            values[str(variant)] = metrics
    return values


def description(study: str, table: pd.DataFrame, experiment_id: str, run_id: str) -> str:
    """The parent run's description: the figure (its own artifact, `get-artifact` relative to the server
    that shows the page), the table as `hmer report --study` prints it, and what the summary runs are."""
    image = f"get-artifact?path={FIGURE_ARTIFACT}&run_uuid={run_id}"
    page = f"#/experiments/{experiment_id}/runs/{run_id}/artifacts/{FIGURE_ARTIFACT}"
    return (f"![{study}: ExpRate by variant and test year]({image})\n\n"
            f"{format_table(table, 'markdown')}\n"
            f"The figure ([{FIGURE_ARTIFACT}]({page})): each variant's ExpRate per test year, a bar at the "
            f"mean over its seeds, whiskers ± 1 std, a dot per seed. `hmer report --study {study}` prints this "
            f"table and draws the figure. The trials are this run's child runs, \"<variant> seed <n>\" (tag "
            f"`{keys.VARIANT}`); beside them, \"<variant>: mean of <n> seeds\" holds each variant's mean ExpRate "
            f"per test year (metrics `<year> ExpRate`, %), so that the chart view compares the variants in one "
            f"chart per year.\n")


def annotate_study(study: str, tracking_uri: str | None = None, *, runs: pd.DataFrame | None = None,
                   table: pd.DataFrame | None = None) -> list[str]:
    """Write the grid study's figure, table, description and summary runs where they differ; returns
    what was written. `runs` and `table`: the study's `load_runs` and `study_table`, if at hand."""
    uri = resolve_tracking_uri(tracking_uri)
    parent = study_parent(study, uri)
    if parent is None:
        return []
    runs = load_runs(uri, study=study) if runs is None else runs
    table = study_table(study, uri, runs=runs) if table is None else table
    client = mlflow_client(uri)
    run = client.get_run(parent["run_id"])
    if table.empty:
        return []
    order = [str(v) for v, row in table.iterrows() if int(row.get("seeds", 0) or 0) > 0]
    colors = variant_colors(order)
    table_changed = _write_artifact(client, run, TABLE_ARTIFACT, format_table(table, "markdown").encode())
    changes = [TABLE_ARTIFACT] if table_changed else []
    if order and (table_changed or _stored_artifact(client, run, FIGURE_ARTIFACT) is None):
        figure = plot_exprate(runs[scored(runs)], order=order, title=study, jitter=0.0)
        _write_artifact(client, run, FIGURE_ARTIFACT, _png(figure))
        changes.append(FIGURE_ARTIFACT)
    note = description(study, table, run.info.experiment_id, run.info.run_id)
    if run.data.tags.get(keys.MLFLOW_NOTE) != note:
        client.set_tag(run.info.run_id, keys.MLFLOW_NOTE, note)
        changes.append("description")
    changes += _summary_runs(client, run, study, table, colors)
    changes += mark_killed_attempts(client, runs)
    recoloured = 0
    for _, trial in runs.iterrows():
        color = colors.get(str(trial.get(f"tags.{keys.VARIANT}")))
        if color and trial.get(f"tags.{keys.MLFLOW_RUN_COLOR}") != color:
            client.set_tag(trial["run_id"], keys.MLFLOW_RUN_COLOR, color)
            recoloured += 1
    if recoloured:
        changes.append(f"its variant's colour on {recoloured} trial run(s)")
    return changes


KILLED_ATTEMPT = " (killed attempt)"  # the end of a killed attempt's run name


def mark_killed_attempts(client, runs: pd.DataFrame) -> list[str]:
    """Tag `hmer.trained_again_in` on each killed trial run whose cell (variant, seed) a later run trained,
    and end its name with KILLED_ATTEMPT: the comparison link (`tracking.ui.ui_url`) leaves it out."""
    if runs.empty or "status" not in runs.columns:
        return []
    finished = runs[runs["status"] == "FINISHED"]
    done = {(str(r["variant"]), str(r["seed"])): str(r["run_id"]) for _, r in finished.iterrows()}
    marked = 0
    for _, attempt in runs[runs["status"] != "FINISHED"].iterrows():
        again = done.get((str(attempt["variant"]), str(attempt["seed"])))
        if again is None or attempt.get(f"tags.{keys.TRAINED_AGAIN_IN}") == again:
            continue
        client.set_tag(attempt["run_id"], keys.TRAINED_AGAIN_IN, again)
        name = str(attempt.get("run_name") or "")
        if not name.endswith(KILLED_ATTEMPT):
            client.set_tag(attempt["run_id"], keys.MLFLOW_RUN_NAME, name + KILLED_ATTEMPT)
        marked += 1
    return [f"{marked} killed attempt(s) marked as trained again"] if marked else []


def summary_runs(client, experiment_id: str, study: str) -> list:
    """The study's summary runs (deleted ones aside)."""
    summaries = f"{study_filter(study)} and tags.`{keys.ROLE}` = '{keys.ROLE_SUMMARY}'"
    return search_all_runs(client, [experiment_id], summaries)


def comparison_metric(study: str, tracking_uri: str | None = None) -> str:
    """The metric a study's comparison in the MLflow UI is ordered by: its summary runs' first test year
    (`2014 ExpRate`), else what every trial logs (`best_val_exprate`: a sweep's trials are not tested)."""
    uri = resolve_tracking_uri(tracking_uri)
    parent = study_parent(study, uri)
    if parent is not None and summary_runs(mlflow_client(uri), str(parent["experiment_id"]), study):
        years = scored_years(load_runs(uri, study=study))
        if years:
            return summary_metric(years[0])
    return "best_val_exprate"


def _summary_runs(client, parent, study: str, table: pd.DataFrame, colors: dict[str, str]) -> list[str]:
    """Create or bring up to date one summary run per variant; delete those of variants gone."""
    wanted = summary_values(table)
    when = int(parent.info.end_time or parent.info.start_time or 0)  # the study's end: made again, the same record
    changes: list[str] = []
    existing = _one_summary_each(client, parent.info.experiment_id, study, wanted, changes)
    created = updated = 0
    for variant, metrics in wanted.items():
        name = summary_run_name(variant, int(table.loc[variant, "seeds"]))
        tags = {keys.MLFLOW_PARENT_RUN_ID: parent.info.run_id, keys.STUDY: study, keys.ROLE: keys.ROLE_SUMMARY,
                keys.VARIANT: variant, keys.MLFLOW_RUN_COLOR: colors[variant]}
        run = existing.get(variant)
        if run is None:
            run = client.create_run(parent.info.experiment_id, start_time=when, tags=tags, run_name=name)
            created += 1
            stale = metrics
        else:
            stale = {k: v for k, v in metrics.items() if k not in run.data.metrics
                     or not math.isclose(run.data.metrics[k], v, rel_tol=1e-12, abs_tol=1e-12)}
            retag = {k: v for k, v in tags.items() if run.data.tags.get(k) != v}
            if run.info.run_name != name:
                retag[keys.MLFLOW_RUN_NAME] = name
            for key, value in retag.items():
                client.set_tag(run.info.run_id, key, value)
            updated += bool(stale or retag)
        if stale:
            client.log_batch(run.info.run_id, metrics=[Metric(k, v, when, 0) for k, v in sorted(stale.items())])
        if run.info.status != "FINISHED":
            client.set_terminated(run.info.run_id, status="FINISHED", end_time=when)
    if created:
        # two workers on a tracking server (no lock) may both create a variant's summary: keep one
        _one_summary_each(client, parent.info.experiment_id, study, wanted, [])
        changes.append(f"{created} summary run(s)")
    if updated:
        changes.append(f"{updated} summary run(s) brought up to date")
    return changes


def _one_summary_each(client, experiment_id: str, study: str, wanted: dict, changes: list[str]) -> dict[str, Any]:
    """{variant: its summary run}; the others are deleted (a variant gone, or all but a variant's smallest run id)."""
    kept: dict[str, Any] = {}
    for run in sorted(summary_runs(client, experiment_id, study), key=lambda r: r.info.run_id):
        variant = run.data.tags.get(keys.VARIANT, "")
        if variant in wanted and variant not in kept:
            kept[variant] = run
        else:
            client.delete_run(run.info.run_id)
            changes.append(f"summary run {run.info.run_name!r} deleted")
    return kept


def _png(figure) -> bytes:
    """The figure as PNG at most `FIGURE_WIDTH_PX` wide: at the reports' resolution, then lower until it
    fits (its tight box is only known once drawn)."""
    dpi = float(FIGURE_DPI)
    while True:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
        png = buffer.getvalue()
        width = int.from_bytes(png[16:20], "big")  # the PNG header's width (IHDR)
        if width <= FIGURE_WIDTH_PX or dpi < 20:
            return png
        dpi *= (FIGURE_WIDTH_PX - 2) / width


def _stored_artifact(client, run, name: str) -> bytes | None:
    """The artifact `name` of `run` as stored, None where there is none yet."""
    try:
        with tempfile.TemporaryDirectory(prefix="hmer-artifact-") as tmp:
            return Path(download_run_artifact(client, run.info.run_id, name, tmp)).read_bytes()
    except Exception:  # noqa: BLE001 - not there yet
        return None


def _write_artifact(client, run, name: str, content: bytes) -> bool:
    """Write the artifact `name` of `run` unless it holds `content` already; True if written."""
    if _stored_artifact(client, run, name) == content:
        return False
    root = resolve_artifact_uri(run.info.artifact_uri, client.tracking_uri)
    if root.startswith(("file:", "/")):  # on this machine: written in place
        path = Path(unquote(urlparse(root).path) if root.startswith("file:") else root) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda f: f.write(content))
        return True
    with tempfile.TemporaryDirectory(prefix="hmer-artifact-") as tmp:
        local = Path(tmp) / name
        local.write_bytes(content)
        client.log_artifact(run.info.run_id, str(local))
    return True
