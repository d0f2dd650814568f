"""How MLflow's web UI opens the suite's experiments: as model training, on the runs, compared.

MLflow 3's UI (3.17.2, pinned) picks an experiment's view (GenAI or model training) from the page's
`workflowType` parameter, else the visitor's last choice (starting as GenAI); the experiment tag
`mlflow.experimentKind` decided it up to 3.9 (mlflow/mlflow#20161). So every experiment the suite
creates carries the tag (`TRAINING_EXPERIMENT_TAGS`; `mark_training_experiments` for an older store),
and its links `workflowType=machine_learning`.

A study's link orders its runs by a metric (`orderByKey`, best first): the table lists every run
flat, and the charts (the first ten listed) draw the variants' summary runs first (`store.study_run`:
they alone have the metric `2014 ExpRate`).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote, urlencode

from . import keys
from .portable import sqlite_path

HOST = "127.0.0.1"  # both UIs listen on this machine alone (`servers.py`)
DEFAULT_PORT = 5000  # `mlflow ui`'s default
DASHBOARD_PORT = 8080  # optuna-dashboard's default
WORKFLOW_TYPE_TRAINING = "machine_learning"
# A study's link shows its variants' summary runs and its trials only: the parent run, failed trials and
# killed attempts trained again would each take one of the ten runs the charts draw. Pruned trials stay.
STUDY_COMPARISON_RUNS = (f"attributes.status != 'FAILED' and tags.`{keys.MLFLOW_PARENT_RUN_ID}` IS NOT NULL "
                         f"and tags.`{keys.TRAINED_AGAIN_IN}` IS NULL")
TRAINING_EXPERIMENT_TAGS = {keys.MLFLOW_EXPERIMENT_KIND: keys.EXPERIMENT_KIND_TRAINING}


def ui_url(experiment_id: str | None = None, *, port: int = DEFAULT_PORT, order_by: str | None = None,
           search: str | None = None) -> str:
    """The `mlflow ui` link to an experiment's training runs matching `search`, as charts, highest
    `order_by` first; without an experiment, the list of experiments."""
    query = {"workflowType": WORKFLOW_TYPE_TRAINING}
    if experiment_id is None:
        return f"http://{HOST}:{port}/#/experiments?{urlencode(query)}"
    query["compareRunsMode"] = "CHART"
    if order_by:
        query.update(orderByKey=f"metrics.`{order_by}`", orderByAsc="false")
    if search:
        query["searchFilter"] = search
    return f"http://{HOST}:{port}/#/experiments/{experiment_id}/runs?{urlencode(query, quote_via=quote)}"


def study_url(experiment_id: str, *, order_by: str | None = None, port: int = DEFAULT_PORT) -> str:
    """The link to a study's comparison (`STUDY_COMPARISON_RUNS`), best `order_by` first, as charts."""
    return ui_url(experiment_id, order_by=order_by, port=port, search=STUDY_COMPARISON_RUNS)


def run_url(experiment_id: str, run_id: str, *, port: int = DEFAULT_PORT) -> str:
    """The link that opens one run (its parameters, metrics and artifacts) in `mlflow ui`."""
    query = urlencode({"workflowType": WORKFLOW_TYPE_TRAINING})
    return f"http://{HOST}:{port}/#/experiments/{experiment_id}/runs/{run_id}?{query}"


def ui_command(tracking_uri: str, cwd: str | os.PathLike[str] | None = None) -> str:
    """The `mlflow ui` command serving `tracking_uri`, a SQLite store under the working folder by its
    relative path (`sqlite:///mlruns/mlflow.db`, as the README says)."""
    db = sqlite_path(tracking_uri)
    if db is None:
        return f"mlflow ui --backend-store-uri {tracking_uri}"
    here = Path(cwd or Path.cwd()).resolve()
    try:
        shown = db.resolve().relative_to(here).as_posix()
    except ValueError:
        shown = db.resolve().as_posix()
    return f"mlflow ui --backend-store-uri sqlite:///{shown}"


def ui_hint(tracking_uri: str, experiment_id: str, order_by: str | None = None) -> str:
    """One line for the end of a study or a report: the command and the link to its comparison."""
    return (f"compare in the MLflow UI: {ui_command(tracking_uri)}, then open "
            f"{study_url(experiment_id, order_by=order_by)} (`hmer ui` starts it beside optuna-dashboard and "
            f"prints every study's link)")


def dashboard_url(study_id: int | None = None, *, port: int = DASHBOARD_PORT) -> str:
    """The optuna-dashboard link to a study (its storage's id), else to the list of studies."""
    base = f"http://{HOST}:{port}/dashboard/"
    return base if study_id is None else f"{base}studies/{study_id}"


def mark_training_experiments(client) -> list[str]:
    """Tag each experiment without `mlflow.experimentKind` as model training; returns their names."""
    from mlflow.entities import ViewType

    marked = []
    for experiment in client.search_experiments(view_type=ViewType.ALL):
        if keys.MLFLOW_EXPERIMENT_KIND not in experiment.tags:
            client.set_experiment_tag(experiment.experiment_id, keys.MLFLOW_EXPERIMENT_KIND,
                                      keys.EXPERIMENT_KIND_TRAINING)
            marked.append(experiment.name)
    return marked
