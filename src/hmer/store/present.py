"""A study as its users open it, in the MLflow UI (`store.study_run`) and optuna-dashboard.

A finished or superseded grid gets its figure, table, description and summary runs, its killed
attempts that a later run trained again marked; a finished sweep its table and description. Called
when a study ends (hmer.cli.study) and by `hmer runs present | publish | supersede`. Presenting
again writes nothing: a store presented twice keeps its bytes.

In optuna-dashboard a study gets its objective's name (not "Objective 0"), its description
(`hmer.description`) and a note: what it compares, why "Best Trial" is not a grid's answer, its failed
and taken-over trials and what supersedes it. Each FAIL trial gets a note (Optuna changes no finished
trial's attributes): why it failed, and the trial that continued it. Only what differs is written.
"""

from __future__ import annotations

import collections
import contextlib
from pathlib import Path
from typing import Any, Mapping

import optuna
import pandas as pd
from mlflow.exceptions import MlflowException
from optuna.trial import FrozenTrial, TrialState

from ..reports.markup import markdown, mean_pm_std
from ..reports.runs import list_studies, load_runs, resolve_tracking_uri, study_parent
from ..studies.bookings import failure_reason
from ..studies.session import OBJECTIVE_NAMES, name_objective
from ..studies.spec import STUDIES
from ..studies.storage import default_storage, first_use_lock, trial_id
from ..studies.sweep_report import sweep_table
from ..tracking import keys
from ..tracking.portable import load_run_json
from ..tracking.store import mlflow_client
from .study_run import TABLE_ARTIFACT, _write_artifact, annotate_study, mark_killed_attempts


def present_study(study: str, *, tracking_uri: str | None = None, storage: str | None = None) -> list[str]:
    """Present `study` in both UIs; returns what was written, in words. The Optuna side is skipped when
    `storage` (default: `optuna.db` beside a SQLite store) has no such study; no SQLite file is created."""
    uri = resolve_tracking_uri(tracking_uri)
    with first_use_lock(uri):  # a study's workers on one machine that end together take turns
        try:
            return _present(study, uri, storage)
        except MlflowException:
            # workers on several machines (a tracking server, no lock) may insert the same new key at
            # once, and the second insert fails: a second pass writes only what still differs
            return _present(study, uri, storage)


def _present(study: str, uri: str, storage: str | None) -> list[str]:
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
        optuna_study, optuna_storage = load_for_notes(study, url)
        kind = _text(optuna_study.user_attrs.get(keys.KIND)) or kind
        changes += annotate_optuna_study(
            optuna_study, optuna_storage, objective_name=OBJECTIVE_NAMES.get(kind or "", ""), kind=kind or "",
            description=_description(optuna_study, parent, uri), superseded_by=superseded_by, table=table)
    return changes


def present_studies(tracking_uri: str | None = None, storage: str | None = None) -> dict[str, list[str]]:
    """`present_study` for every study of the MLflow store and of the Optuna storage: {study: changes}."""
    uri = resolve_tracking_uri(tracking_uri)
    names = [str(name) for name in list_studies(uri)["study"]]
    url = _storage_url(storage, uri)
    if url is not None:
        names += [name for name in optuna.get_all_study_names(url) if name not in names]
    return {name: present_study(name, tracking_uri=uri, storage=url) for name in names}


def _storage_url(storage: str | None, tracking_uri: str) -> str | None:
    """The Optuna storage to present, None where there is none (a SQLite file that opening would create)."""
    if storage is None:
        storage = default_storage(tracking_uri) if tracking_uri.startswith("sqlite:///") else None
    missing = storage is not None and storage.startswith("sqlite:///") and not Path(storage[10:]).is_file()
    return None if missing else storage


def _description(study, parent, tracking_uri: str) -> str | None:
    """What the study compares: its stored description, else its parent run's `study.json`'s, else its spec's."""
    found = _text(study.user_attrs.get(keys.DESCRIPTION))
    if not found and parent is not None:
        with contextlib.suppress(Exception):  # a parent run without its study.json: the spec says it
            found = _text(load_run_json(mlflow_client(tracking_uri), str(parent["run_id"]), "study.json")
                          .get("description"))
    name = _text(study.user_attrs.get(keys.SPEC))
    return found or (STUDIES.get(name).description if name is not None and name in STUDIES else None)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def annotate_sweep(study: str, run_id: str, tracking_uri: str, storage: str | None) -> list[str]:
    """Write the sweep's table (`sweep_table`, from its Optuna storage: default optuna.db beside the
    MLflow store) onto its parent run `run_id`, where it differs; returns what was written."""
    storage = storage or default_storage(tracking_uri, create=False)
    text = sweep_table(optuna.load_study(study_name=study, storage=storage))
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


def continuations(trials: list[FrozenTrial]) -> dict[int, tuple[int, str]]:
    """{FAIL trial's number: (the later trial that took it over, how)}: the one naming it
    (`hmer.resumed_from`, `hmer.continues`), else the next trial of its cell (`hmer.cell_key`)."""
    taken: dict[int, tuple[int, str]] = {}
    for t in trials:
        resumed = t.user_attrs.get(keys.RESUMED_FROM)
        if isinstance(resumed, Mapping) and isinstance(resumed.get("trial"), int):
            epoch = resumed.get("epoch")
            taken.setdefault(resumed["trial"], (t.number, f"continued its run from epoch {epoch + 1}"
                                                if isinstance(epoch, int) else "continued its run"))
        continued = t.user_attrs.get(keys.CONTINUES)
        if continued is not None and str(continued).isdigit():
            taken.setdefault(int(continued), (t.number, "ran its parameters again"))
    failed = {t.number: t for t in trials if t.state == TrialState.FAIL}
    for t in failed.values():
        if t.number in taken or keys.CELL_KEY not in t.user_attrs:
            continue
        cell = t.user_attrs[keys.CELL_KEY]
        later = [u for u in trials if u.number > t.number and u.user_attrs.get(keys.CELL_KEY) == cell]
        if later:
            taken[t.number] = (later[0].number, "ran its cell again from the first epoch")
    return {number: how for number, how in taken.items() if number in failed}


def trial_note(trial: FrozenTrial, taken: Mapping[int, tuple[int, str]]) -> str:
    """The note of a FAIL trial: why, and which trial continued it."""
    then = (f"Trial {taken[trial.number][0]} took it over: it {taken[trial.number][1]}."
            if trial.number in taken else "No later trial took it over.")
    return f"**Failed**: {failure_reason(trial)}.\n\n{then}\n"


def scores_table(table: pd.DataFrame) -> str:
    """A `study_table`'s ExpRate per variant and test year, mean ± std over seeds, in Markdown."""
    years = [str(y) for y in table.attrs.get("years", [])]
    body = [[f"{variant} (baseline)" if bool(row.get("baseline", False)) else str(variant), str(int(row["seeds"]))]
            + [mean_pm_std(row.get(f"{y}_exprate_mean"), row.get(f"{y}_exprate_std")) for y in years]
            for variant, row in table.iterrows()]
    return markdown(["variant", "seeds", *[f"{y} ExpRate" for y in years]], body)


def study_note(study: optuna.Study, *, objective_name: str, kind: str, description: str | None,
               superseded_by: str | None, table: pd.DataFrame | None, trials: list[FrozenTrial]) -> str:
    """The study's note (module docstring), in Markdown."""
    parts = [f"**{study.study_name}**" + (f": {description}" if description else "")]
    if superseded_by:
        parts.append(f"**Superseded by {superseded_by}**: this study is kept for reference; the suite's "
                     f"reports and claims read {superseded_by}.")
    objective = f"The objective is the {objective_name} of the trial's model."
    if kind == "grid":
        objective += (" Each trial is one seed of one variant, so the dashboard's \"Best Trial\" is the "
                      "best single seed, not the study's answer: the study compares the variants by their "
                      "mean test ExpRate over seeds" + (", here in %:" if table is not None and not table.empty
                                                         else " (its table, once every cell is complete)."))
    parts.append(objective)
    if kind == "grid" and table is not None and not table.empty:
        parts.append(scores_table(table))
    counts = collections.Counter(t.state.name for t in trials)
    listed = ", ".join(f"{n} {state}" for state, n in counts.most_common())
    failed = [t for t in trials if t.state == TrialState.FAIL]
    line = f"Optuna lists {len(trials)} trial{'s' if len(trials) != 1 else ''}" + (f" ({listed})." if listed else ".")
    if failed:
        taken = continuations(trials)
        line += (f" {len(taken)} of the {len(failed)} FAIL trials were taken over by a later trial (a worker "
                 f"died, or a cell ran again): each failed trial's note says why it failed and which trial "
                 f"continued it.")
    parts.append(line)
    parts.append("Its runs are in the MLflow experiment of the same name (`hmer ui` prints the link that "
                 "compares them).")
    return "\n\n".join(parts) + "\n"


def annotate_optuna_study(study: optuna.Study, storage: optuna.storages.BaseStorage, *, objective_name: str,
                          kind: str, description: str | None, superseded_by: str | None = None,
                          table: pd.DataFrame | None = None) -> list[str]:
    """Write what differs (module docstring); returns what was written. `storage`: `load_for_notes`'s."""
    from optuna_dashboard import get_note, save_note

    changes = []
    if objective_name and study.metric_names != [objective_name]:
        name_objective(study, objective_name)
        changes.append(f"objective named {objective_name!r}")
    for key, value in ((keys.DESCRIPTION, description), (keys.SUPERSEDED_BY, superseded_by)):
        if value and study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)
            changes.append(f"user attribute {key}")
    trials = study.get_trials(deepcopy=False)
    note = study_note(study, objective_name=objective_name, kind=kind, description=description,
                      superseded_by=superseded_by, table=table, trials=trials)
    if get_note(study) != note:
        save_note(study, note)
        changes.append("note")
    taken = continuations(trials)
    noted = 0
    for frozen in trials:
        if frozen.state != TrialState.FAIL:
            continue
        # save_note takes a live Trial; made for a finished one under a sampler that writes nothing,
        # it only reads, and the note goes to the study's attributes
        trial = optuna.Trial(study, trial_id(storage, study, frozen.number))
        body = trial_note(frozen, taken)
        if get_note(trial) != body:
            save_note(trial, body)
            noted += 1
    if noted:
        changes.append(f"notes on {noted} failed trial(s)")
    return changes


def load_for_notes(study_name: str, storage: str) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    """The study and its storage, under a sampler that writes nothing when a Trial is made for a
    finished trial (a grid's sampler would record its grid on it)."""
    store = optuna.storages.RDBStorage(storage)
    study = optuna.load_study(study_name=study_name, storage=store, sampler=optuna.samplers.RandomSampler(seed=0))
    return study, store
