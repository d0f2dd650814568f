"""A clean store, as committed (read on other machines): no machine path (`tracking.portable.machine_paths`)
in its databases, artifacts or checkpoints, no RUNNING run or trial, every study called by its name
(experiment, `hmer.study` tags, parent run's name and `study` param, Optuna's `hmer.experiment`).

`hmer runs publish` refuses a copy in which `store_problems` still finds anything.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import optuna

from ..atomic import write_text_atomically
from ..checkpoint import LEGACY_MODEL_FILE, MODEL_FILE, atomic_torch_save, load_checkpoint, save_model_file
from ..studies.storage import open_storage
from ..tracking import keys
from ..tracking.portable import (ARTIFACTS, CHECKPOINTS, STORE_FOLDER, machine_paths, make_values_portable,
                                portable_text, set_params)

MLFLOW_DB, OPTUNA_DB = "mlflow.db", "optuna.db"
TEXT_FILES = (".json", ".md", ".txt", ".csv", ".tsv", ".yaml", ".yml", ".html", ".log")
MODEL_FILES = (".safetensors", ".pt", ".pth")
# The study's storage as a published store holds it: optuna.db beside mlflow.db, read from the checkout.
PUBLISHED_STORAGE = f"sqlite:///{STORE_FOLDER}/{OPTUNA_DB}"
STORAGE_PARAM = "storage"  # a study's parent run: its Optuna storage (hmer.studies.session)
STUDY_PARAM = "study"  # a study's parent run: its name


@dataclass(frozen=True)
class Problem:
    where: str  # "run <id> (experiment <name>) param storage", "artifacts/<...>/config.json", ...
    what: str  # "names the machine path /work/x", "is RUNNING", ...

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


# ---- finding ---------------------------------------------------------------------------------------

def store_problems(folder: str | Path) -> list[Problem]:
    """Every problem (module docstring) of the store in `folder`: its databases, artifacts, checkpoints."""
    folder = Path(folder)
    problems: list[Problem] = []
    for name, more in ((MLFLOW_DB, _mlflow_problems), (OPTUNA_DB, _optuna_problems)):
        if (folder / name).is_file():
            with _read_only(folder / name) as db:
                problems += [*_database_paths(db, name), *more(db)]
    for path in _files(folder):
        problems += [Problem(path.relative_to(folder).as_posix(), f"names the machine path {found}")
                     for found in _file_paths(path)]
    return problems


def _read_only(path: Path):
    return closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True))


def _database_paths(db: sqlite3.Connection, name: str) -> Iterator[Problem]:
    """Machine paths in any text value of any table, each named by its table, row key and column."""
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        columns = db.execute(f'PRAGMA table_info("{table}")').fetchall()
        key = [c[1] for c in sorted(columns, key=lambda c: c[5]) if c[5]] or ["rowid"]
        names = [c[1] for c in columns]
        for row in db.execute(f'SELECT {", ".join(key)}, {", ".join(names)} FROM "{table}"'):
            for column, value in zip(names, row[len(key):]):
                if isinstance(value, str):
                    for found in machine_paths(value):
                        row_key = ", ".join(f"{k}={v}" for k, v in zip(key, row))
                        yield Problem(f"{name} {table} ({row_key}) {column}", f"names the machine path {found}")


def _mlflow_problems(db: sqlite3.Connection) -> Iterator[Problem]:
    experiments = dict(db.execute("SELECT experiment_id, name FROM experiments").fetchall())
    for run_id, experiment_id, status in db.execute("SELECT run_uuid, experiment_id, status FROM runs"):
        if status == "RUNNING":
            yield Problem(f"run {run_id} (experiment {experiments.get(experiment_id)})", "is RUNNING")
    tags: dict[str, dict[str, str]] = {}
    for run_id, key, value in db.execute("SELECT run_uuid, key, value FROM tags WHERE key IN (?, ?, ?)",
                                         (keys.STUDY, keys.ROLE, keys.MLFLOW_RUN_NAME)):
        tags.setdefault(run_id, {})[key] = value
    params = {run_id: value for run_id, value in
              db.execute("SELECT run_uuid, value FROM params WHERE key = ?", (STUDY_PARAM,))}
    for run_id, experiment_id in db.execute("SELECT run_uuid, experiment_id FROM runs"):
        study = tags.get(run_id, {}).get(keys.STUDY)
        if study is None:
            continue
        where = f"run {run_id} (study {study})"
        if experiments.get(experiment_id) != study:
            yield Problem(where, f"is in the experiment {experiments.get(experiment_id)!r}, not {study!r}")
        if tags[run_id].get(keys.ROLE) == "study":
            if tags[run_id].get(keys.MLFLOW_RUN_NAME) != study:
                yield Problem(where, f"the study's parent run is named {tags[run_id].get(keys.MLFLOW_RUN_NAME)!r}")
            if params.get(run_id, study) != study:
                yield Problem(where, f"the study's parent run has the param {STUDY_PARAM}={params[run_id]!r}")


def _optuna_problems(db: sqlite3.Connection) -> Iterator[Problem]:
    names = dict(db.execute("SELECT study_id, study_name FROM studies").fetchall())
    for study_id, number in db.execute("SELECT study_id, number FROM trials WHERE state = 'RUNNING'"):
        yield Problem(f"Optuna study {names[study_id]} trial {number}", "is RUNNING")
    for study_id, value in db.execute("SELECT study_id, value_json FROM study_user_attributes WHERE key = ?",
                                      (keys.EXPERIMENT,)):
        if json.loads(value) != names[study_id]:
            yield Problem(f"Optuna study {names[study_id]}", f"its {keys.EXPERIMENT} says {json.loads(value)!r}")


def _files(folder: Path) -> Iterator[Path]:
    """The artifact and checkpoint files that can name a path (text, JSON, model files), in order."""
    for part in (ARTIFACTS, CHECKPOINTS):
        if (folder / part).is_dir():
            yield from sorted(p for p in (folder / part).rglob("*")
                              if p.is_file() and p.suffix.lower() in TEXT_FILES + MODEL_FILES)


def _file_paths(path: Path) -> list[str]:
    if path.suffix.lower() in TEXT_FILES:
        return machine_paths(path.read_text(errors="replace"))
    found: list[str] = []

    def find(text: str) -> str:
        found.extend(machine_paths(text))
        return text

    # every string a model file or checkpoint holds besides its tensors (its config, vocabulary)
    _map_strings({k: v for k, v in load_checkpoint(path).items() if k not in ("model", "optimizer")}, find)
    return found


# ---- fixing ----------------------------------------------------------------------------------------

def make_paths_portable(folder: str | Path, stores: Sequence[Path] = ()) -> list[str]:
    """Write every machine path in the store in `folder` as a clone reads it (`portable_text`): params,
    tags, a study's `storage` (the store's own optuna.db), study attributes, text artifacts, model files
    (a `model.pt` becomes `model.safetensors`) and checkpoints; returns what changed, in words. Trial
    attributes are left (Optuna changes no finished trial): `store_problems` reports them."""
    folder = Path(folder)
    stores = [folder, *stores]
    changed = []
    db = folder / MLFLOW_DB
    if db.is_file():
        published = _published_storages(folder)
        set_params(db, published)
        changed += [f"run {run_id} param {key}" for run_id, key in published]
        changed += make_values_portable(db, stores)
    if (folder / OPTUNA_DB).is_file():
        changed += _portable_study_attrs(f"sqlite:///{folder / OPTUNA_DB}", stores)
    for path in _files(folder):
        if not _file_paths(path):
            continue
        if path.suffix.lower() in TEXT_FILES:
            write_text_atomically(path, portable_text(path.read_text(), stores))
        else:
            path = _portable_model_file(path, stores)
        changed.append(path.relative_to(folder).as_posix())
    return changed


def _published_storages(folder: Path) -> dict[tuple[str, str], str]:
    """{(parent run id, "storage"): PUBLISHED_STORAGE} for each study whose parent run names a machine's
    storage and whose Optuna study the store's optuna.db holds."""
    if not (folder / OPTUNA_DB).is_file():
        return {}
    with _read_only(folder / OPTUNA_DB) as db:
        in_storage = {name for (name,) in db.execute("SELECT study_name FROM studies")}
    with _read_only(folder / MLFLOW_DB) as db:
        rows = db.execute(
            "SELECT p.run_uuid, p.value, t.value FROM params p JOIN tags t ON t.run_uuid = p.run_uuid "
            "AND t.key = ? JOIN tags r ON r.run_uuid = p.run_uuid AND r.key = ? AND r.value = 'study' "
            "WHERE p.key = ?", (keys.STUDY, keys.ROLE, STORAGE_PARAM)).fetchall()
    return {(run_id, STORAGE_PARAM): PUBLISHED_STORAGE for run_id, value, study in rows
            if study in in_storage and machine_paths(value)}


def _portable_study_attrs(storage: str, stores: Sequence[Path]) -> list[str]:
    store = open_storage(storage)
    changed = []
    for summary in optuna.get_all_study_summaries(store, include_best_trial=False):
        study_id = store.get_study_id_from_name(summary.study_name)
        for kind, read, write in (("user", store.get_study_user_attrs, store.set_study_user_attr),
                                  ("system", store.get_study_system_attrs, store.set_study_system_attr)):
            for key, value in read(study_id).items():
                portable = _map_strings(value, lambda text: portable_text(text, stores))
                if portable != value:
                    write(study_id, key, portable)
                    changed.append(f"Optuna study {summary.study_name} {kind} attr {key}")
    return changed


def _map_strings(value, change: Callable[[str], str]):
    """A JSON-like value with `change` applied to each string."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {k: _map_strings(v, change) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_strings(v, change) for v in value)
    return value


def _portable_model_file(path: Path, stores: Sequence[Path]) -> Path:
    """Rewrite a model file or checkpoint with portable strings; returns where it is now."""
    ckpt = load_checkpoint(path)
    portable = {k: (v if k in ("model", "optimizer") else _map_strings(v, lambda text: portable_text(text, stores)))
                for k, v in ckpt.items()}
    if path.name in (MODEL_FILE, LEGACY_MODEL_FILE):  # a run's model artifact: safetensors, the same every time
        target = path.with_name(MODEL_FILE)
        save_model_file(portable, target)
        if target != path:
            path.unlink()
        return target
    atomic_torch_save(portable, path)  # a checkpoint to be continued: the trainer's own format
    return path
