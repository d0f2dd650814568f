"""How a study reads in optuna-dashboard: its objective by name, what it compares, and its failed trials' fates.

A study gets its objective's name (not "Objective 0"), its description (`hmer.description`) and a
note: what it compares, why "Best Trial" is not a grid's answer, its failed and taken-over trials and
what supersedes it. Each FAIL trial gets a note (Optuna changes no finished trial's attributes): why
it failed, and the trial that continued it. Only what differs is written.
"""

from __future__ import annotations

import collections
from typing import Mapping

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from ..studies.bookings import failure_reason
from ..studies.opening import name_objective
from ..tracking import keys

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
    from ..reports.markup import markdown, mean_pm_std

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

    from ..studies.storage import trial_id

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
