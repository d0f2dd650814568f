"""Where runs are recorded: the project's MLflow home and its defaults.

The default store is embedded: `mlruns/mlflow.db` (SQLite: MLflow 3 refuses a plain file store for
new features) with artifacts in `mlruns/artifacts/`; `MLFLOW_TRACKING_URI` points every command at a
server instead. In a checkout `mlruns/` is the committed store, which `hmer runs publish` alone
writes; a smoke-budget study is tracked in `scratch/` unless a store is named. Runs keep their
checkpoints beside their store.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlparse

from . import keys

DEFAULT_EXPERIMENT = "hmer"
SCRATCH = "scratch"  # the scratch store's folder in the checkout (git-ignored)


def project_root() -> Path:
    """The checkout (a `pyproject.toml` naming this project) at or above the working folder, else the
    one this package is in, else the working folder: `mlruns/` is the same from `notebooks/`."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and 'name = "hmer"' in pyproject.read_text(errors="ignore"):
            return folder
    source_checkout = Path(__file__).resolve().parents[3]
    if (source_checkout / "pyproject.toml").is_file():
        return source_checkout
    return here


def mlruns_dir() -> Path:
    """The MLflow home: `$HMER_MLRUNS`, else `<project root>/mlruns`."""
    return Path(os.environ.get("HMER_MLRUNS") or project_root() / "mlruns").resolve()


def default_tracking_uri() -> str:
    """`$MLFLOW_TRACKING_URI`, else SQLite in the MLflow home."""
    return os.environ.get("MLFLOW_TRACKING_URI") or _sqlite_store(mlruns_dir())


def _sqlite_store(home: Path) -> str:
    """The URI of the SQLite store in the folder `home`, made where missing."""
    check_store_folder(home)
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


class NoStoreThere(ValueError):
    """A command that reads a store was given a place that holds none: one line naming it."""


def check_store_folder(folder: Path) -> None:
    """NoStoreThere naming a plain file on the way to `folder` (where mkdir would raise a bare
    FileExistsError)."""
    for place in (folder, *folder.parents):
        if place.exists():
            if not place.is_dir():
                raise NoStoreThere(f"{place} is a file, not a folder: no store can be at {folder}")
            return


def existing_store(tracking_uri: str | None = None) -> str:
    """The store `tracking_uri` names (default: the project's), for a command that reads or amends it,
    creating nothing: a mistyped path must not become a new empty store reported on as the one meant.
    NoStoreThere names a missing `mlflow.db`, or one damaged or not MLflow's (`ui.check_database`)."""
    from .portable import sqlite_path
    from .ui import check_database

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{mlruns_dir() / 'mlflow.db'}"
    db = sqlite_path(uri)
    if db is None:
        return uri
    check_store_folder(db.parent)
    if not db.is_file():
        raise NoStoreThere(f"{db}: no MLflow store there (no such file): give the folder of an existing store "
                           f"(HMER_MLRUNS, --tracking-uri); nothing was created")
    check_database(db, "nothing was changed", role="mlflow.db")
    return uri


def store_named() -> bool:
    """Whether $MLFLOW_TRACKING_URI or $HMER_MLRUNS names a store."""
    return bool(os.environ.get("MLFLOW_TRACKING_URI") or os.environ.get("HMER_MLRUNS"))


def scratch_tracking_uri() -> str:
    """The store the environment names, else `<project root>/scratch/`: trying the pipeline never
    changes the committed store (`mlruns/`)."""
    return default_tracking_uri() if store_named() else _sqlite_store((project_root() / SCRATCH).resolve())


def mlflow_client(tracking_uri: str | None = None):
    """An `MlflowClient` on `tracking_uri` (default: the project's store)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri or default_tracking_uri())


def search_all_runs(client, experiment_ids: Sequence[str] | None = None, filter_string: str = "", *,
                    oldest_first: bool = False, deleted_too: bool = False, page_size: int = 1000) -> list[Any]:
    """Every run of `experiment_ids` (default: all; `deleted_too`: deleted ones as well) matching
    `filter_string`, page by page: a store outgrows MLflow's one page a call unnoticed. Every search
    meaning "all of them" goes through here (tests/test_code_quality.py holds it)."""
    from mlflow.entities import ViewType

    view = ViewType.ALL if deleted_too else ViewType.ACTIVE_ONLY
    ids = list(experiment_ids) if experiment_ids is not None else [
        e.experiment_id for e in client.search_experiments(view_type=view)]
    runs: list[Any] = []
    token = None
    while ids:
        page = client.search_runs(ids, filter_string=filter_string, run_view_type=view, max_results=page_size,
                                  order_by=["attributes.start_time ASC"] if oldest_first else None,
                                  page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            break
    return runs


def study_filter(study: str) -> str:
    """The `search_all_runs` filter of a study's runs (tag `hmer.study`)."""
    quoted = study.replace("'", "\\'")
    return f"tags.`{keys.STUDY}` = '{quoted}'"


def artifact_root_for(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store; in the MLflow home for
    another database (MLflow's default is `./mlruns` of whatever folder the process runs in); None
    for a server or a file store, which decide for themselves."""
    parsed = urlparse(tracking_uri)
    scheme = parsed.scheme.split("+")[0]  # postgresql+psycopg2 -> postgresql
    if scheme == "sqlite":
        db_path = Path(tracking_uri[len("sqlite:///"):])
        return (db_path.parent / "artifacts").resolve().as_uri()
    if scheme in ("postgresql", "mysql", "mssql"):
        return (mlruns_dir() / "artifacts").resolve().as_uri()
    return None


def mask_password(uri: str) -> str:
    """`uri` (an MLflow store's, or an Optuna storage's) with the password of its user part replaced by ***
    (scheme://user:***@host/...)."""
    parsed = urlparse(uri)
    if parsed.password is None:
        return uri
    user, _, host = parsed.netloc.rpartition("@")
    return parsed._replace(netloc=f"{user.partition(':')[0]}:***@{host}").geturl()


def check_tracking_server(uri: str, timeout_s: float = 10.0) -> None:
    """ValueError naming `uri` when it is an http(s) tracking server that cannot be reached: MLflow
    retries a refused connection for minutes before saying so. Any HTTP answer counts as reachable
    (a proxy may refuse /health without credentials)."""
    import urllib.error
    import urllib.request

    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return
    bare = parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()  # urllib takes no user:password@
    try:
        with urllib.request.urlopen(bare.rstrip("/") + "/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ValueError(f"cannot reach the MLflow tracking server {mask_password(uri)}: {reason}") from None


def checkpoint_root(tracking_uri: str | None = None) -> Path:
    """Where runs in progress keep their checkpoints (`<root>/<run id>/`): `checkpoints/` beside the
    SQLite store (default: the project's), so a run tracked elsewhere writes nothing into the checkout;
    in the MLflow home for a database or a server."""
    from .portable import CHECKPOINTS, sqlite_path

    db = sqlite_path(tracking_uri or default_tracking_uri())
    return (db.resolve().parent if db is not None else mlruns_dir()) / CHECKPOINTS


def quiet_mlflow() -> None:
    """MLflow's and alembic's INFO logging and artifact download bars (three for one model made an
    error no longer one line) kept out of the terminal; warnings and errors still show."""
    import logging

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    import mlflow  # noqa: F401 - configures its loggers on import; adjust them after

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def point_mlflow_at(tracking_uri: str | None = None) -> str:
    """Make `tracking_uri` (default: the project's store) MLflow's current one, quiet; returns it."""
    import mlflow

    quiet_mlflow()
    uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    return uri


def open_experiment(tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT) -> tuple[Any, str]:
    """(an MlflowClient, the id of `experiment`): MLflow pointed at the store, the experiment made
    (`ensure_experiment`) and set as MLflow's current one."""
    import mlflow

    client = mlflow_client(point_mlflow_at(tracking_uri))
    experiment_id = ensure_experiment(client, experiment)
    mlflow.set_experiment(experiment_id=experiment_id)
    return client, experiment_id


def ensure_experiment(client, name: str, tags: dict[str, str] | None = None) -> str:
    """The id of experiment `name`, created when missing: artifacts where `artifact_root_for` puts
    them, a model-training experiment (tracking/ui.py) with `tags` (except MLflow's own)."""
    from .ui import TRAINING_EXPERIMENT_TAGS

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    root = artifact_root_for(client.tracking_uri)
    keep = {**TRAINING_EXPERIMENT_TAGS, **{k: v for k, v in (tags or {}).items() if not k.startswith("mlflow.")}}
    try:
        return client.create_experiment(name, artifact_location=f"{root}/{name}" if root else None, tags=keep)
    except Exception:  # created meanwhile by another process
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def git_commit(short: bool = False, root: str | os.PathLike[str] | None = None) -> str:
    """The commit of the checkout at `root` (default: `project_root()`), '-dirty' with changes to
    tracked files, or 'unknown'; `short`: abbreviated, as the benchmark scripts print it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root or project_root(), capture_output=True, text=True,
                              timeout=5).stdout.strip()

    try:
        sha = git("rev-parse", *(["--short"] if short else []), "HEAD")
        return sha + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "") if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
