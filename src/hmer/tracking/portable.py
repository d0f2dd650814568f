"""The committed store, read from any clone: artifact locations relative to the checkout.

MLflow records artifact locations as absolute paths (no public API records a relative one), so
`make_portable` rewrites those in the store's `artifacts/` as `mlruns/artifacts/...`: MLflow reads
them relative to the working folder (`mlflow ui` from the checkout), the suite's readers relative to
the store. Other machine paths (a parent run's Optuna storage, a run's `--data`) become `mlruns/...`
inside the store, `<local>/<file name>` outside it (`portable_text`).

The one place that writes MLflow's tables directly (SQLite only). Make only a finished copy
portable: runs still being written would log artifacts relative to the cwd.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path, PureWindowsPath
from typing import Mapping, Sequence
from urllib.parse import unquote, urlparse

ARTIFACTS = "artifacts"
CHECKPOINTS = "checkpoints"  # runs in progress: `<store>/checkpoints/<run id>/last.pt` (store.checkpoint_root)
STORE_FOLDER = "mlruns"  # the store's folder name in the checkout (`<checkout>/mlruns/mlflow.db`)
LOCAL = "<local>"  # in a published store, the folder of a machine path outside the store

# An absolute path of two parts at least (`/work/x`, `~/x`, `C:\x`), bare or in a `sqlite:///` or
# `file:` URL, where a value or word begins; not a "/" inside a word (`exprate_mean/bi`), a URL's
# path (`http://host/a/b`) nor a relative path (`mlruns/artifacts/...`).
_MACHINE_PATH = re.compile(
    r"""(?:^|(?<=[\s"'(\[<=,;]))(?P<scheme>sqlite:///|file://|file:)?"""
    r"""(?P<path>~?/[\w.@+-]+/[^\s"'()<>\[\],;]*|[A-Za-z]:[\\/][^\s"'()<>\[\],;]*)""")


def machine_paths(text: str) -> list[str]:
    """The machine paths in `text`, as they are written there (with their URL scheme)."""
    return [m.group(0) for m in _MACHINE_PATH.finditer(text)]


def portable_path(path: str, stores: Sequence[Path] = ()) -> str:
    """`path` as a published store writes it: `mlruns/<path within>` in one of the folders `stores`
    (the workspace published, the copy), else `<local>/<file name>`."""
    if ":" in path[:3]:  # a Windows path
        return f"{LOCAL}/{PureWindowsPath(path).name}"
    here = Path(path)
    for store in stores:
        for root in {Path(store), Path(store).resolve()}:
            if here.is_relative_to(root):
                return "/".join((STORE_FOLDER, *here.relative_to(root).parts))
    return f"{LOCAL}/{here.name}"


def portable_text(text: str, stores: Sequence[Path] = ()) -> str:
    """`text` with each machine path written as `portable_path` writes it (a URL keeps its scheme:
    `sqlite:////ws/optuna.db` becomes `sqlite:///mlruns/optuna.db`)."""
    return _MACHINE_PATH.sub(lambda m: (m.group("scheme") or "") + portable_path(m.group("path"), stores), text)


def make_values_portable(db_path: str | Path, stores: Sequence[Path] = ()) -> list[str]:
    """The machine paths in the store's params, run and experiment tags rewritten by `portable_text`;
    returns what changed, in words ("run <id> param storage")."""
    changed = []
    with sqlite3.connect(db_path) as db:
        for table, owner, word in (("params", "run_uuid", "run"), ("tags", "run_uuid", "run"),
                                   ("experiment_tags", "experiment_id", "experiment")):
            for row_id, key, value in db.execute(f"SELECT {owner}, key, value FROM {table}").fetchall():
                new = portable_text(value, stores) if value else value
                if new != value:
                    db.execute(f"UPDATE {table} SET value = ? WHERE {owner} = ? AND key = ?", (new, row_id, key))
                    changed.append(f"{word} {row_id} {'param' if table == 'params' else 'tag'} {key}")
    return changed


def set_params(db_path: str | Path, params: Mapping[tuple[str, str], str]) -> None:
    """Set the params {(run id, key): value} in the store `db_path`: MLflow's API writes a param once
    (a published copy's, a renamed study's parent run's are set again here)."""
    with sqlite3.connect(db_path) as db:
        for (run_id, key), value in params.items():
            if db.execute("UPDATE params SET value = ? WHERE run_uuid = ? AND key = ?",
                          (value, run_id, key)).rowcount != 1:
                raise KeyError(f"{db_path}: run {run_id} has no param {key}")


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///...` tracking URI, else None."""
    return Path(tracking_uri[len("sqlite:///"):]) if tracking_uri.startswith("sqlite:///") else None


def _is_local(location: str) -> bool:
    """An absolute local path or file: URI (not a relative one, not a remote store)."""
    parsed = urlparse(location)
    return parsed.scheme == "file" or (parsed.scheme == "" and location.startswith("/"))


def _relative(location: str) -> str | None:
    """`file:///any/where/artifacts/exp/...` -> `mlruns/artifacts/exp/...` (None if not local)."""
    path, marker = unquote(urlparse(location).path), f"/{ARTIFACTS}/"
    if not _is_local(location) or marker not in path:
        return None
    return f"{STORE_FOLDER}/{ARTIFACTS}/{path.rsplit(marker, 1)[1]}"


def make_portable(db_path: str | Path, local: bool = False) -> int:
    """Artifact locations in the store's `artifacts/` made relative (module docstring), an experiment's
    local one elsewhere (MLflow's Default, `<cwd>/mlruns/0`) `mlruns/artifacts/<id>`; `local`: the inverse,
    relative ones made absolute (new runs log from any working folder). Returns the rows changed."""
    folder = Path(db_path).resolve().parent
    changed = 0
    with sqlite3.connect(db_path) as db:
        for table, key, column in (("experiments", "experiment_id", "artifact_location"),
                                   ("runs", "run_uuid", "artifact_uri")):
            for row_id, location in db.execute(f"SELECT {key}, {column} FROM {table}").fetchall():
                location = location or ""
                if local:
                    new = (folder / location[len(STORE_FOLDER) + 1:]).as_uri() \
                        if location.startswith(f"{STORE_FOLDER}/{ARTIFACTS}/") else None
                else:
                    new = _relative(location)
                    if new is None and table == "experiments" and _is_local(location):
                        new = f"{STORE_FOLDER}/{ARTIFACTS}/{row_id}"
                if new and new != location:
                    db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (new, row_id))
                    changed += 1
    return changed


STORE_FILES = ("mlflow.db", "optuna.db")


def snapshot_database(source: Path, dest: Path) -> None:
    """Copy an SQLite database by SQLite's online backup, consistent while workers write; ValueError
    naming `source` when it cannot be read as one. Opened read-write (never created): only so does
    SQLite roll back a killed worker's hot journal."""
    from contextlib import closing

    dest.unlink(missing_ok=True)
    try:
        with closing(sqlite3.connect(f"{source.as_uri()}?mode=rw", uri=True)) as src, \
                closing(sqlite3.connect(dest)) as out:
            src.backup(out)
    except sqlite3.DatabaseError as exc:
        dest.unlink(missing_ok=True)
        what = "not an SQLite database" if "not a database" in str(exc) else "cannot be read"
        raise ValueError(f"{source}: {what} ({exc})") from None


def copy_store(source: str | Path, dest: str | Path, *, portable: bool, checkpoints: bool = False) -> Path:
    """Copy a local store (`mlflow.db`, `optuna.db`, `artifacts/`) from `source` over `dest`, made
    portable (to commit) or local (to run more studies in); returns the copied database. The databases
    replace `dest`'s only once all are copied. `checkpoints` are copied first, so a copy made while
    workers train has none newer than its records (a continued run may repeat an epoch, never skip one)."""
    import os
    import shutil

    source, dest = Path(source).resolve(), Path(dest).resolve()
    if not (source / "mlflow.db").is_file():
        raise FileNotFoundError(f"{source}: no mlflow.db (not a local MLflow store)")
    if source == dest:
        raise ValueError(f"{source}: copying a store onto itself")
    dest.mkdir(parents=True, exist_ok=True)
    staged = dest / f".{CHECKPOINTS}.partial"
    copied = {name: dest / f".{name}.partial" for name in STORE_FILES if (source / name).is_file()}
    try:
        if checkpoints:
            _copy_checkpoints(source / CHECKPOINTS, staged)
        for name, partial in copied.items():
            snapshot_database(source / name, partial)
    except BaseException:
        for partial in copied.values():
            partial.unlink(missing_ok=True)
        shutil.rmtree(staged, ignore_errors=True)
        raise
    for name, partial in copied.items():
        os.replace(partial, dest / name)
    for folder in (ARTIFACTS, CHECKPOINTS):
        if (dest / folder).exists():
            shutil.rmtree(dest / folder)
    if (source / ARTIFACTS).is_dir():
        shutil.copytree(source / ARTIFACTS, dest / ARTIFACTS)
    if staged.is_dir():
        os.replace(staged, dest / CHECKPOINTS)
    make_portable(dest / "mlflow.db")  # from wherever the source was
    if not portable:
        make_portable(dest / "mlflow.db", local=True)  # to where the copy is
    return dest / "mlflow.db"


def _copy_checkpoints(source: Path, dest: Path) -> None:
    """Copy the `<run id>/` folders of `source` (if any) to `dest`, except files being written and
    folders that vanish meanwhile."""
    import shutil

    shutil.rmtree(dest, ignore_errors=True)
    for run in sorted(p for p in source.iterdir() if p.is_dir()) if source.is_dir() else []:
        try:
            shutil.copytree(run, dest / run.name, ignore=shutil.ignore_patterns(".*.tmp"))
        except (FileNotFoundError, shutil.Error):
            if run.exists():
                raise
            shutil.rmtree(dest / run.name, ignore_errors=True)


def resolve_artifact_uri(artifact_uri: str, tracking_uri: str) -> str:
    """Where a run's artifacts are: a portable store's relative location in the store's folder."""
    prefix = f"{STORE_FOLDER}/"
    db = sqlite_path(tracking_uri)
    if not artifact_uri.startswith(prefix) or db is None:
        return artifact_uri
    return (db.resolve().parent / artifact_uri[len(prefix):]).as_uri()


def list_run_artifacts(client, run_id: str, path: str = "") -> list[str]:
    """The names in a run's artifact folder `path` ("" = its root), portable stores read from anywhere."""
    import mlflow.artifacts

    root = resolve_artifact_uri(client.get_run(run_id).info.artifact_uri, client.tracking_uri)
    entries = mlflow.artifacts.list_artifacts(artifact_uri=f"{root}/{path}" if path else root)
    # listed by URI, an entry's path starts with the listed folder's own name: keep the last part
    return [entry.path.rsplit("/", 1)[-1] for entry in entries]


def download_run_artifact(client, run_id: str, path: str, dest: str) -> str:
    """`client.download_artifacts(run_id, path, dest)`, portable stores read from anywhere."""
    import mlflow.artifacts

    root = resolve_artifact_uri(client.get_run(run_id).info.artifact_uri, client.tracking_uri)
    return mlflow.artifacts.download_artifacts(artifact_uri=f"{root}/{path}" if path else root, dst_path=dest)


def load_run_json(client, run_id: str, path: str):
    """A run's JSON artifact `path`, read through a temporary download (`download_run_artifact`)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hmer-artifact-") as tmp:
        return json.loads(Path(download_run_artifact(client, run_id, path, tmp)).read_text())
