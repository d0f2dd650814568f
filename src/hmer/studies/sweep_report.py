"""A sweep read back from its Optuna storage: what `notebooks/sweep.ipynb` shows beside Optuna's plots.

Only reads: a store without an Optuna storage is not given one.
"""

from __future__ import annotations

import collections
import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from ..tracking import keys
from ..tracking.portable import sqlite_path
from ..tracking.store import default_tracking_uri, mlflow_client, project_root
from ..tracking.ui import run_url, ui_command
from .bookings import failure_reason
from .storage import default_storage

# The objective a sweep maximises (`hmer.studies.sweeps.sweep_objective`), as the plots label it.
OBJECTIVE_NAME = "validation ExpRate (%)"
# What its trials report to the pruner at each quarter of their training (`sweeps.PRUNE_METRIC`).
REPORT_NAME = "greedy validation within one edit (%)"
_STATE_ORDER = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)
IMPORTANCE_SEED = 0  # the forest's seed: the same store gives the same figure on every execution


class NoSweepError(LookupError):
    """The store holds no sweep (or not the one asked for); the message says what it holds."""


def find_sweep(tracking_uri: str | None = None, storage: str | None = None,
               study: str | None = None) -> optuna.Study:
    """The sweep `study` of the store's Optuna storage, else its newest sweep; `NoSweepError` in one plain
    line when there is none."""
    url = storage or default_storage(tracking_uri, create=False)  # where a study puts it, not created
    db = sqlite_path(url)
    if db is not None and str(db) != ":memory:" and not db.is_file():
        raise NoSweepError("no sweep in this store yet: it has no Optuna storage (optuna.db beside mlflow.db); "
                           "run one with python studies/sweep.py")
    summaries = optuna.study.get_all_study_summaries(url, include_best_trial=False)
    kinds = {s.study_name: s.user_attrs.get(keys.KIND, "unknown kind") for s in summaries}
    sweeps = [s for s in summaries if kinds[s.study_name] == "sweep"]
    held = ", ".join(f"{name} ({kind})" for name, kind in kinds.items()) or "no study"
    if study is not None:
        if study not in kinds:
            raise NoSweepError(f"no study {study} in this store's Optuna storage; it holds {held}")
        if kinds[study] != "sweep":
            raise NoSweepError(f"{study} is a {kinds[study]} study, not a sweep; this store's Optuna storage "
                               f"holds {held}")
        name = study
    elif not sweeps:
        raise NoSweepError(f"no sweep in this store yet: its Optuna storage holds {held}; run one with "
                           f"python studies/sweep.py")
    else:
        # by its first trial's start; a sweep without trials, or a tie, by the storage's order
        order = {s.study_name: i for i, s in enumerate(summaries)}
        newest = max(sweeps, key=lambda s: (s.datetime_start or _dt.datetime.min, order[s.study_name]))
        name = newest.study_name
    return optuna.load_study(study_name=name, storage=url)


def describe_sweep(study: optuna.Study) -> str:
    """One paragraph: the study, its budget, its trials by state, and the trials it aims for."""
    trials = study.get_trials(deepcopy=False)
    counts = [(sum(t.state == state for t in trials), state.name.lower()) for state in _STATE_ORDER]
    states = ", ".join(f"{n} {state}" for n, state in counts if n) or "no trial yet"
    attrs = study.user_attrs
    aims = attrs.get(keys.N_TRIALS)
    return (f"sweep {study.study_name} (spec {attrs.get(keys.SPEC, '?')}, budget {attrs.get(keys.BUDGET, '?')}, "
            f"MLflow experiment {attrs.get(keys.EXPERIMENT, '?')}): {states}"
            + (f"; it aims for {aims} finished trials" if aims else ""))


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The COMPLETE trials: the only ones Optuna's history, slices and importances use."""
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def continued_by(trials: list[FrozenTrial]) -> dict[int, int]:
    """{number of a trial whose worker died: number of the trial that continued it}."""
    return {t.user_attrs[keys.CONTINUES]: t.number for t in trials if keys.CONTINUES in t.user_attrs}


def failures(study: optuna.Study) -> list[str]:
    """One line per FAIL trial: why, and the trial that continued it, if one did."""
    trials = study.get_trials(deepcopy=False)
    continued = continued_by(trials)
    return [f"trial {t.number} failed: {failure_reason(t, chars=200)}"
            + (f"; trial {continued[t.number]} continued it" if t.number in continued else "")
            for t in trials if t.state == TrialState.FAIL]


def why_no_importances(study: optuna.Study) -> str | None:
    """Why importances cannot be computed (fANOVA needs two finished trials of different objectives), or None."""
    values = {t.value for t in complete_trials(study)}
    n = len(complete_trials(study))
    if n < 2:
        return f"importances need two finished trials; {study.study_name} has {n}"
    if len(values) == 1:
        return (f"every finished trial of {study.study_name} ({n}) scored the same objective, "
                f"{values.pop():.2f}: there is nothing for a parameter to explain")
    return None


def importance_evaluator(seed: int = IMPORTANCE_SEED) -> optuna.importance.FanovaImportanceEvaluator:
    """Optuna's default evaluator, fANOVA, with a fixed seed."""
    return optuna.importance.FanovaImportanceEvaluator(seed=seed)


def importance_spread(study: optuna.Study, resamples: int = 20, seed: int = IMPORTANCE_SEED) -> pd.DataFrame:
    """Each parameter's fANOVA importance, and its 10-90 % range over `resamples` bootstrap resamples of the
    finished trials (each with another seed): how much of the ranking a few trials carry. Most important
    first; resamples whose trials all scored the same are skipped (the `resamples` column counts the rest)."""
    reason = why_no_importances(study)
    if reason is not None:
        raise ValueError(reason)
    trials = complete_trials(study)
    whole = optuna.importance.get_param_importances(study, evaluator=importance_evaluator(seed))
    rng = np.random.default_rng(seed)
    draws: list[dict[str, float]] = []
    for i in range(resamples):
        sample = [trials[j] for j in rng.integers(0, len(trials), len(trials))]
        if len({t.value for t in sample}) < 2:
            continue
        resampled = optuna.create_study(direction=study.direction)
        resampled.add_trials(sample)
        draws.append(optuna.importance.get_param_importances(resampled, evaluator=importance_evaluator(seed + 1 + i)))
    rows = []
    for name, value in whole.items():
        spread = np.array([d.get(name, 0.0) for d in draws]) if draws else np.array([math.nan])
        rows.append({"parameter": name, "importance": value, "resampled 10 %": np.nanpercentile(spread, 10),
                     "resampled 90 %": np.nanpercentile(spread, 90), "resamples": len(draws)})
    return pd.DataFrame(rows).set_index("parameter")


def _whole(value: float | None) -> int | float:
    """A count that MLflow stored as a float, as an int (NaN when absent)."""
    return int(value) if value is not None and math.isfinite(value) else math.nan


@dataclass(frozen=True)
class BestTrial:
    """The best finished trial of a sweep, with what its MLflow run recorded."""

    number: int
    objective: float
    config: pd.DataFrame  # key -> value as trained: what the sweep set over the study's base config
    summary: pd.Series  # run, link, validation ExpRates, measured cost
    url: str | None  # its run in `mlflow ui`; None when the run is not in the MLflow store
    serve: str  # the `mlflow ui` command that serves the store, from the checkout


def best_trial(study: optuna.Study, tracking_uri: str | None = None) -> BestTrial:
    """The best finished trial (ValueError when none has): its config as trained (the keys the sweep set,
    with its MLflow run's values) and summary (run and link, validation ExpRates decoded as the test
    years, `val` and `val-alt`, and measured cost)."""
    from ..data.augment import VAL_ALT

    trial = study.best_trial
    assert trial.value is not None  # the best trial is a finished one
    run_id = trial.user_attrs.get(keys.TRIAL_RUN_ID)
    run = None
    if run_id:
        try:
            run = mlflow_client(tracking_uri).get_run(run_id)
        except Exception:  # noqa: BLE001 - not in this MLflow store: the Optuna record still stands
            run = None
    # Its cell label lists every key the trial set; the values as trained are the run's params.
    label = trial.user_attrs.get(keys.CELL, "")
    pairs = [item.split("=", 1) for item in label.split(",") if "=" in item]
    params = run.data.params if run is not None else {}
    config = pd.DataFrame([{"key": k, "value": params.get(k, v)} for k, v in pairs],
                          columns=["key", "value"]).set_index("key")
    metrics = run.data.metrics if run is not None else {}
    per_image = trial.user_attrs.get(keys.TRIAL_CPU_SECONDS_PER_IMAGE)
    url = run_url(run.info.experiment_id, run.info.run_id) if run is not None else None
    summary = pd.Series({
        "trial": trial.number,
        "objective (validation ExpRate %)": trial.value,
        "validation ExpRate % (beam)": metrics.get("val_final_exprate", math.nan),
        "val-alt ExpRate % (beam)": metrics.get(f"{VAL_ALT}_final_exprate", math.nan),
        "validation ≤1 %": metrics.get("val_final_le1", math.nan),
        "training CPU-ms per image (measured)": per_image * 1000 if per_image is not None else math.nan,
        "epochs that fit its CPU-minutes": trial.user_attrs.get(keys.TRIAL_FITTED_EPOCHS, math.nan),
        "epochs trained": trial.user_attrs.get(keys.TRIAL_EPOCHS, math.nan),
        "best epoch": _whole(metrics.get("best_epoch")),
        "training wall minutes": metrics.get("train_seconds", math.nan) / 60,
        "parameters": _whole(metrics.get("num_params")),
        "MLflow run": run_id or "none recorded",
        "link (mlflow ui)": url or "not in this MLflow store",
    }, dtype=object).map(lambda v: round(v, 2) if isinstance(v, float) else v)
    return BestTrial(number=trial.number, objective=float(trial.value), config=config, summary=summary, url=url,
                     serve=ui_command(tracking_uri or default_tracking_uri(), cwd=project_root()))


def sweep_table(study: optuna.Study) -> str:
    """The sweep's trials, best objective first, then pruned ones, with their parameters."""
    rows = []
    trials = study.get_trials(deepcopy=False)
    continued = continued_by(trials)
    for t in trials:
        last = max(t.intermediate_values) if t.intermediate_values else None
        # Optuna gives a pruned trial its last report as its value: that is the pruning metric,
        # not the objective, and stays in "val <=1 then".
        objective = t.value if t.state == TrialState.COMPLETE and t.value is not None else math.nan
        state = t.state.name + (f"->{continued[t.number]}" if t.number in continued else "")
        row: dict[str, Any] = {"trial": t.number, "state": state, "objective": objective,
                               "trained %": last if last is not None else math.nan,
                               "val <=1 then": t.intermediate_values[last] if last is not None else math.nan}
        scored = keys.trial_score("test_")
        row.update({key[len(scored):-len("_exprate")] + " ExpRate": value for key, value in t.user_attrs.items()
                    if key.startswith(scored) and key.endswith("_exprate")})
        row.update({k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in t.params.items()})
        rows.append(row)
    if not rows:
        return "(no trials)"
    # finished trials by their objective, then pruned ones by how far and how well they got
    df = pd.DataFrame(rows).sort_values(["objective", "trained %", "val <=1 then"], ascending=False,
                                        na_position="last")
    states = collections.Counter(t.state.name for t in trials)
    counts = ", ".join(f"{n} {state.lower()}" for state, n in states.most_common())
    if continued:
        counts += f"; {len(continued)} of the failed continued by a later trial"
    table = df.to_string(index=False, float_format="%.2f")
    note = ("\nFAIL->N: the trial's worker died and trial N continued its run from its last epoch"
            if continued else "")
    return f"sweep {study.study_name}: {len(df)} trials ({counts})\n{table}{note}"
