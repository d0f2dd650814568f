"""How MLflow's web UI opens the suite's experiments: as model training, on the runs, compared.

MLflow 3's UI has two views of an experiment: GenAI (traces, an overview of LLM calls) and model
training (runs, metrics, charts). How it chooses, in the version this suite pins (3.17.2: its
`WorkflowTypeContext` and the experiment page's redirect, `useNavigateToExperimentPageTab`, in the
bundle it ships):

- the `workflowType` query parameter of the page (`genai` or `machine_learning`), else the
  visitor's last choice of the "GenAI / Model training" switch, kept in the browser's local storage
  (`mlflow.workflowType_v1`, per address), which starts as GenAI. Opening `#/experiments/<id>`, as
  choosing an experiment in the list does, redirects to the runs tab for `machine_learning` and to
  the GenAI overview otherwise.
- The experiment's tag `mlflow.experimentKind` (`custom_model_development` for training,
  `genai_development` for GenAI) is how MLflow records what an experiment is for. MLflow 3.9 and
  earlier chose the view from it when an experiment opened; since 3.10 (mlflow/mlflow#20161) the
  kind follows the switch instead, and no release up to 3.18 reads the tag there. 3.9 cannot open
  a 3.17 store (it does not know its schema), so no release opens the committed store's
  experiments as training when one is chosen in the list of a fresh browser.

So the suite does both: every experiment it creates carries the tag (`TRAINING_EXPERIMENT_TAGS`;
`mark_training_experiments` adds it to an older store), and the links it prints carry
`workflowType=machine_learning`, which opens the runs of a study in any browser.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlencode

from . import keys
from .portable import sqlite_path

DEFAULT_PORT = 5000  # `mlflow ui`'s default
WORKFLOW_TYPE_TRAINING = "machine_learning"
TRAINING_EXPERIMENT_TAGS = {keys.MLFLOW_EXPERIMENT_KIND: keys.EXPERIMENT_KIND_TRAINING}


def ui_url(experiment_id: str | None = None, *, charts: bool = True, port: int = DEFAULT_PORT,
           host: str = "127.0.0.1") -> str:
    """The link that opens an experiment's training runs (`charts`: as charts, the variants side by
    side) in `mlflow ui`; without an experiment, the list of experiments in the training view."""
    query = {"workflowType": WORKFLOW_TYPE_TRAINING}
    if experiment_id is None:
        return f"http://{host}:{port}/#/experiments?{urlencode(query)}"
    if charts:
        query["compareRunsMode"] = "CHART"
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def run_url(experiment_id: str, run_id: str, *, port: int = DEFAULT_PORT, host: str = "127.0.0.1") -> str:
    """The link that opens one run (its parameters, metrics and artifacts) in `mlflow ui`."""
    query = urlencode({"workflowType": WORKFLOW_TYPE_TRAINING})
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs/{run_id}?{query}"


def ui_command(tracking_uri: str, cwd: str | os.PathLike[str] | None = None) -> str:
    """The `mlflow ui` command that serves `tracking_uri`: a SQLite store under the working folder
    by its relative path (`sqlite:///mlruns/mlflow.db` from a checkout, as the README says)."""
    db = sqlite_path(tracking_uri)
    if db is None:
        return f"mlflow ui --backend-store-uri {tracking_uri}"
    here = Path(cwd or Path.cwd()).resolve()
    try:
        shown = db.resolve().relative_to(here).as_posix()
    except ValueError:
        shown = db.resolve().as_posix()
    return f"mlflow ui --backend-store-uri sqlite:///{shown}"


def ui_hint(tracking_uri: str, experiment_id: str) -> str:
    """One line for the end of a study or a report: the command and the link to its comparison."""
    return f"compare in the MLflow UI: {ui_command(tracking_uri)}, then open {ui_url(experiment_id)}"


def mark_training_experiments(client) -> list[str]:
    """Tag every experiment of the store that has no `mlflow.experimentKind` as model training;
    returns the names of those tagged (none when the store is up to date: nothing is written)."""
    from mlflow.entities import ViewType

    marked = []
    for experiment in client.search_experiments(view_type=ViewType.ALL):
        if keys.MLFLOW_EXPERIMENT_KIND not in experiment.tags:
            client.set_experiment_tag(experiment.experiment_id, keys.MLFLOW_EXPERIMENT_KIND,
                                      keys.EXPERIMENT_KIND_TRAINING)
            marked.append(experiment.name)
    return marked
