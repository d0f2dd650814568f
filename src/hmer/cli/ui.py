"""`hmer ui`: the MLflow UI and optuna-dashboard on a store, and the link to each study's comparison."""

from __future__ import annotations

import sys
from pathlib import Path

from .options import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("ui", help="start the MLflow UI and optuna-dashboard on the committed store (or --store) "
                       "and print each study's links; Ctrl-C stops both")
    p.add_argument("--store", default=None, metavar="FOLDER",
                   help="the store's folder (mlflow.db, artifacts/, optuna.db); default: the MLflow home, "
                        "mlruns/ of the checkout (served from a copy: what the UIs do is not kept)")
    p.add_argument("--mlflow-port", type=int, default=5000, metavar="N", help="the MLflow UI's port (default 5000)")
    p.add_argument("--dashboard-port", type=int, default=8080, metavar="N",
                   help="optuna-dashboard's port (default 8080)")
    p.set_defaults(func=cmd_ui)


def cmd_ui(args) -> int:
    from ..signals import stop_on_signals
    from ..tracking.portable import STORE_FOLDER
    from ..tracking.ui import serve_store
    from ..tracking.store import mlruns_dir, project_root, quiet_mlflow

    for option, port in (("--mlflow-port", args.mlflow_port), ("--dashboard-port", args.dashboard_port)):
        if not 1 <= port <= 65535:  # before anything starts (a socket would raise OverflowError)
            raise UserError(f"{option} {port}: a port is a number from 1 to 65535")
    quiet_mlflow()
    folder = Path(args.store).resolve() if args.store else mlruns_dir()
    committed = folder == (project_root() / STORE_FOLDER).resolve()
    print(f"hmer ui: starting the MLflow UI and optuna-dashboard on {folder} (a minute on a busy machine) ...",
          flush=True)
    with stop_on_signals():  # Ctrl-C or SIGTERM: both servers stopped, the copy removed
        try:
            with serve_store(folder, mlflow_port=args.mlflow_port, dashboard_port=args.dashboard_port,
                             from_copy=committed) as served:
                dashboard_port = args.dashboard_port if served.storage is not None else None
                for line in served_lines(served, committed, args.mlflow_port, dashboard_port):
                    print(line, flush=True)
                stopped = served.wait()
                print(f"hmer ui: {stopped} stopped; the other is stopped too", flush=True)
                return 1
        except KeyboardInterrupt:
            print("hmer ui: stopped the MLflow UI and optuna-dashboard", flush=True)
            return 0
        except RuntimeError as exc:  # a server that did not start: what its log says
            print(f"hmer: error: {exc}", file=sys.stderr)
            return 2


def served_lines(served, committed: bool, mlflow_port: int, dashboard_port: int | None) -> list[str]:
    """What `hmer ui` prints once both UIs answer: where they are, and each study's links."""
    from ..tracking.ui import dashboard_url, ui_url

    lines = [f"The committed store {served.folder} is served from a copy of its databases ({served.copy}): what is "
             f"done in the UIs is not kept." if committed else
             f"{served.folder} is served in place: what is done in the UIs is written there.",
             f"  MLflow UI         {ui_url(port=mlflow_port)}"]
    if dashboard_port is not None:
        lines.append(f"  optuna-dashboard  {dashboard_url(port=dashboard_port)}")
    else:
        lines.append("  optuna-dashboard  not started: the store has no optuna.db, or optuna-dashboard is not "
                     "installed (pip install -e .)")
    studies = study_links(served.tracking_uri, served.storage, mlflow_port, dashboard_port)
    if studies:
        lines.append("Each study: its comparison in the MLflow UI (its variants, then its trials; the charts "
                     "first) and its trials in optuna-dashboard:")
        lines += studies
    lines.append("Ctrl-C stops both.")
    return lines


def study_links(tracking_uri: str, storage: str | None, mlflow_port: int, dashboard_port: int | None) -> list[str]:
    """Two lines a study: `  <study> (kind, state[, superseded by X])`, then its links."""
    import optuna

    from ..reports.runs import list_studies
    from ..store.study_run import comparison_metric
    from ..tracking.store import mlflow_client
    from ..tracking.ui import dashboard_url, ui_url

    client = mlflow_client(tracking_uri)
    optuna_ids: dict[str, int] = {}
    if storage is not None and dashboard_port is not None:
        opened = optuna.storages.RDBStorage(storage)
        optuna_ids = {name: opened.get_study_id_from_name(name) for name in optuna.get_all_study_names(opened)}
    lines = []
    studies = list_studies(tracking_uri).sort_values("study")
    for _, row in studies.iterrows():
        name = str(row["study"])
        experiment = client.get_experiment_by_name(str(row["experiment"]))
        state = ", ".join(str(v) for v in (row["kind"], row["state"]) if isinstance(v, str) and v)
        if isinstance(row["superseded_by"], str) and row["superseded_by"]:
            state += f"; superseded by {row['superseded_by']}"
        lines.append(f"  {name} ({state})")
        if experiment is not None:
            link = ui_url(experiment.experiment_id, order_by=comparison_metric(name, tracking_uri), port=mlflow_port,
                          study=True)
            lines.append(f"    MLflow  {link}")
        if name in optuna_ids and dashboard_port is not None:
            lines.append(f"    Optuna  {dashboard_url(optuna_ids[name], port=dashboard_port)}")
    return lines
