"""A study as its users open it, in the MLflow UI (`store.study_run`) and optuna-dashboard (`store.dashboard`).

A finished or superseded grid gets its figure, table, description and summary runs, its killed
attempts that a later run trained again marked; a finished sweep its table and description. Called
when a study ends (hmer.cli.study) and by `hmer runs present | publish | supersede`. Presenting
again writes nothing: a store presented twice keeps its bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..tracking import keys


def present_study(study: str, *, tracking_uri: str | None = None, storage: str | None = None) -> list[str]:
    """Present `study` in both UIs; returns what was written, in words. The Optuna side is skipped when
    `storage` (default: `optuna.db` beside a SQLite store) has no such study; no SQLite file is created."""
    from mlflow.exceptions import MlflowException

    from ..reports.runs import resolve_tracking_uri
    from ..studies.storage import first_use_lock

    uri = resolve_tracking_uri(tracking_uri)
    with first_use_lock(uri):  # a study's workers on one machine that end together take turns
        try:
            return _present(study, uri, storage)
        except MlflowException:
            # workers on several machines (a tracking server, no lock) may insert the same new key at
            # once, and the second insert fails: a second pass writes only what still differs
            return _present(study, uri, storage)


def _present(study: str, uri: str, storage: str | None) -> list[str]:
    import optuna

    from ..reports.runs import load_runs, study_parent
    from ..tracking.store import mlflow_client
    from .study_run import annotate_study, mark_killed_attempts

    parent = study_parent(study, uri)
    url = _storage_url(storage, uri)
    changes: list[str] = []
    table = superseded_by = kind = None
    if parent is not None:
        kind = _text(parent.get(f"tags.{keys.KIND}"))
        superseded_by = _text(parent.get(f"tags.{keys.SUPERSEDED_BY}"))
        if kind == "grid":
            runs = load_runs(uri, study=study)
            # a killed attempt leaves the comparison once its cell is trained again, finished study or not
            changes += mark_killed_attempts(mlflow_client(uri), runs)
        if kind == "grid" and (parent["state"] == "finished" or superseded_by):
            from ..reports.tables import study_table

            table = study_table(study, uri, runs=runs)
            changes += annotate_study(study, uri, runs=runs, table=table)
        elif kind == "sweep" and parent["state"] == "finished":
            changes += annotate_sweep(study, str(parent["run_id"]), uri, url)
    if url is not None and study in optuna.get_all_study_names(url):
        from ..studies.session import OBJECTIVE_NAMES
        from .dashboard import annotate_optuna_study, load_for_notes

        optuna_study, optuna_storage = load_for_notes(study, url)
        kind = _text(optuna_study.user_attrs.get(keys.KIND)) or kind
        changes += annotate_optuna_study(
            optuna_study, optuna_storage, objective_name=OBJECTIVE_NAMES.get(kind or "", ""), kind=kind or "",
            description=_description(optuna_study, parent, uri), superseded_by=superseded_by, table=table)
    return changes


def present_studies(tracking_uri: str | None = None, storage: str | None = None) -> dict[str, list[str]]:
    """`present_study` for every study of the MLflow store and of the Optuna storage: {study: changes}."""
    from ..reports.runs import list_studies, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    names = [str(name) for name in list_studies(uri)["study"]]
    url = _storage_url(storage, uri)
    if url is not None:
        import optuna

        names += [name for name in optuna.get_all_study_names(url) if name not in names]
    return {name: present_study(name, tracking_uri=uri, storage=url) for name in names}


def _storage_url(storage: str | None, tracking_uri: str) -> str | None:
    """The Optuna storage to present, None where there is none (a SQLite file that opening would create)."""
    from ..studies.storage import default_storage

    if storage is None and not tracking_uri.startswith("sqlite:///"):
        return None
    url = default_storage(tracking_uri) if storage is None else storage
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        return None
    return url


def _description(study, parent, tracking_uri: str) -> str | None:
    """What the study compares: its stored description, else its parent run's `study.json`'s, else its spec's."""
    stored = _text(study.user_attrs.get(keys.DESCRIPTION))
    if stored:
        return stored
    if parent is not None:
        from ..tracking.portable import load_run_json
        from ..tracking.store import mlflow_client

        try:
            found = _text(load_run_json(mlflow_client(tracking_uri), str(parent["run_id"]), "study.json")
                          .get("description"))
            if found:
                return found
        except Exception:  # noqa: BLE001 - a parent run without its study.json: the spec says it
            pass
    from ..studies.spec import STUDIES

    name = _text(study.user_attrs.get(keys.SPEC))
    return STUDIES.get(name).description if name is not None and name in STUDIES else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def annotate_sweep(study: str, run_id: str, tracking_uri: str, storage: str | None) -> list[str]:
    """Write the sweep's table (`sweep_table`, from its Optuna storage: default optuna.db beside the
    MLflow store) onto its parent run `run_id`, where it differs; returns what was written."""
    import optuna

    from ..studies.sweep_report import sweep_storage, sweep_table
    from ..tracking.store import mlflow_client
    from .study_run import TABLE_ARTIFACT, _write_artifact

    text = sweep_table(optuna.load_study(study_name=study, storage=sweep_storage(tracking_uri, storage)))
    table_md = f"```\n{text}\n```\n"
    client = mlflow_client(tracking_uri)
    run = client.get_run(run_id)
    changes: list[str] = []
    note = sweep_description(study, text)
    if run.data.tags.get(keys.MLFLOW_NOTE) != note:
        client.set_tag(run.info.run_id, keys.MLFLOW_NOTE, note)
        changes.append("description")
    if _write_artifact(client, run, TABLE_ARTIFACT, table_md.encode()):
        changes.append(TABLE_ARTIFACT)
    return changes


NOTE_CHARS = 6000  # a description longer than MLflow's 8000-character tag limit would be cut off


def sweep_description(study: str, text: str) -> str:
    """The sweep's parent-run description: as much of its table (best trials first) as fits; `table.md` holds all."""
    from .study_run import TABLE_ARTIFACT  # (the reports' plotting stays out of a study's start)

    lines = text.splitlines()
    header, rows = lines[:2], [line for line in lines[2:] if line.startswith(" ") or line[:1].isdigit()]
    shown: list[str] = []
    for row in rows:
        if sum(len(line) + 1 for line in header + shown + [row]) > NOTE_CHARS:
            break
        shown.append(row)
    cut = (f"the best {len(shown)} of {len(rows)} trials here, every trial in {TABLE_ARTIFACT}; "
           if len(shown) < len(rows) else "")
    block = "\n".join(header + shown)
    return (f"```\n{block}\n```\n\n{cut}its trials are this run's child runs; notebooks/sweep.ipynb plots the "
            f"sweep {study}.\n")


