"""Grid studies: every (variant, seed) cell of a `StudySpec` trained once, then the per-year table.

    outcome = run_grid_study(DIRECTION, "smoke")          # python studies/ablate_direction.py

Running the same command again resumes the study: trials left RUNNING by a dead worker are
marked FAIL (their MLflow runs FAILED), and their cells run again, continuing the dead trial's
run from its last checkpoint where there is one (`resume.py`); COMPLETE cells never run twice,
also not with several workers (`claims.py`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from ..tracking import keys
from ..tracking.store import mask_password
from ..tracking.ui import ui_hint
from .budgets import StudyBudget
from .claims import CellClaims, ClaimedGridSampler, Worker, describe_cell_key
from .mlflow_runs import finish_parent
from .objective import run_one_trial, train_trial
from .session import (POLL_S, Session, StudyOutcome, base_config, load_data, open_session, open_study, resolve,
                      set_threads, start_workers)
from .spec import SEED_KEY, StudySpec, cell_key, cell_label, variant_label
from .storage import mask_url, open_storage, study_exists


def run_grid_study(
    spec: StudySpec,
    budget: str | StudyBudget = "smoke",
    *,
    storage: str | None = None,
    tracking_uri: str | None = None,
    n_jobs: int | None = None,
    data_path: str | None = None,
    data: dict[str, list] | None = None,
    study_name: str | None = None,
    seeds: Sequence[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    print_table: bool = True,
    role: str = "main",
) -> StudyOutcome:
    """Run (or resume) the grid study `spec` under `budget` until every cell is COMPLETE.

    Args:
        spec: the grid (see `hmer.studies.spec`).
        budget: smoke, cpu, short or paper, or a StudyBudget.
        storage: an RDB URL shared by every worker; default SQLite beside the MLflow store.
        tracking_uri: the MLflow store; default `hmer.tracking.default_tracking_uri()`.
        n_jobs: worker processes on this machine (default: the budget's); each loads the data.
        data_path: the dataset (folder or zip); default the usual search (`hmer.data`).
        data: already-loaded splits, for a single worker (tests); overrides `data_path`.
        study_name: default "<spec name>-<budget>".
        seeds: the seed axis; default the budget's.
        overrides: Config overrides held equal in every cell (`--set`).
        print_table: print the per-year table at the end.
        role: "main" prints the banner and the table and waits for the other workers;
            "worker" (the extra processes of n_jobs) only runs trials.
    """
    setup = resolve(spec.name, budget, n_jobs=n_jobs, data=data, study_name=study_name, role=role,
                    tracking_uri=tracking_uri, storage=storage)
    budget, n_jobs, name, main, say = setup.budget, setup.n_jobs, setup.name, setup.main, setup.say
    seeds = tuple(int(s) for s in (seeds or budget.seeds))
    cells = spec.cells(seeds)
    space = spec.search_space(seeds)
    model_preset = spec.model_preset(budget.model_size)
    base = base_config(model_preset, budget, len(cells), n_jobs, spec.fixed, overrides, data_path)
    spec.check_cells(base, seeds)  # a cell its keys do not allow fails now, not after the cells before it
    if main:
        say(f"study {name}: {spec.description}")
        say(budget.describe(len(cells), n_jobs))
        say(f"  grid: {', '.join(f'{k} in {list(v)}' for k, v in space.items())} = {len(cells)} trials "
            f"({len(seeds)} seed{'s' if len(seeds) > 1 else ''} per variant); baseline "
            f"{cell_label(spec.baseline_cell)}; model preset {model_preset}")
        say(f"  Optuna storage {mask_url(setup.storage_url)}; MLflow {mask_password(setup.tracking_uri)}, "
            f"experiment {name}")

    if data is None and not study_exists(setup.storage_url, name):
        data = load_data(base, say)  # bad data fails here, before a study or an MLflow run exists
    store = open_storage(setup.storage_url)
    sampler = ClaimedGridSampler(space, store)
    attrs = {keys.SPEC: spec.name, keys.BUDGET: budget.name, keys.GRID: space, keys.BASELINE: spec.baseline_cell,
             keys.EXPERIMENT: name}
    study, base, created = open_study(setup, store, kind="grid", sampler=sampler, pruner=optuna.pruners.NopPruner(),
                                      attrs=attrs, base=base)
    worker = Worker.current()
    claims = CellClaims(study, worker, store)
    reaped = claims.reap()
    if reaped and main:
        say(f"resuming: trial(s) {', '.join(str(t.number) for t in reaped)} of a dead worker marked FAIL; "
            f"their cells run again")
    status = claims.status()
    done = sum(cell_key(c) in status.complete for c in cells)
    if done and main:
        say(f"resuming: {done} of {len(cells)} cells already complete")
    session = open_session(
        setup, store, study, base, created, worker,
        params={"study": name, "kind": "grid", "spec": spec.name, "preset": budget.name,
                "grid": json.dumps(space), "baseline": json.dumps(spec.baseline_cell),
                "storage": mask_url(setup.storage_url), "n_trials": len(cells), "model_preset": model_preset},
        tags={keys.BUDGET: budget.name, keys.KIND: "grid", keys.VARIANT: spec.name},
        artifact={"spec": spec.name, "description": spec.description, "grid": space,
                  "baseline": spec.baseline_cell, "config": base.to_flat_dict()},
        reopen=done < len(cells))

    children: list = []
    failed_here: set[str] = set()
    interrupted = False
    try:
        if data is None and status.open_cells(cells, set()):
            data = load_data(base, say)  # once per process; the extra workers then read the warm cache
        if main:
            children = start_workers(run_grid_study, spec, budget, n_jobs, setup.storage_url, setup.tracking_uri,
                                     data_path, name, overrides, seeds=seeds, print_table=False)
        set_threads(n_jobs)
        _worker_loop(session, spec, sampler, claims, cells, space, data, failed_here, wait=main)
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: the trial in progress is marked FAIL; run the same command to resume it")
        raise
    finally:
        for child in children:
            if interrupted:  # a SIGTERM sent to this process alone: the workers stop their trials too
                child.terminate()
            child.join()
        status = claims.status()
        n_complete = sum(cell_key(c) in status.complete for c in cells)
        complete = n_complete == len(cells)
        failed = [describe_cell_key(k) for k in sorted(failed_here)]
        if main:
            session.fail_dead_trial_runs()
            finish_parent(session.client, study, session.parent_run_id, complete, failed, interrupted)
    outcome = StudyOutcome(study_name=name, storage=setup.storage_url, tracking_uri=setup.tracking_uri,
                           experiment=name, parent_run_id=session.parent_run_id, complete=complete,
                           n_complete=n_complete, n_expected=len(cells), failed=failed)
    if main:
        say(f"study {name}: {n_complete} of {len(cells)} cells complete"
            + ("" if complete else f"; failed: {'; '.join(outcome.failed) or 'none here'} "
               f"(run the same command to retry them)"))
        outcome.table = _end_of_study(session, complete)
        if print_table and outcome.table:
            print(outcome.table, flush=True)
            say(ui_hint(setup.tracking_uri, session.experiment_id))
    return outcome


def _end_of_study(session: Session, complete: bool) -> str:
    """The study's table as text; a complete study's parent run also gets it as its description,
    with the variants' summary metrics (`hmer.reports.study_run`: written only where they changed,
    so a finished study run again writes nothing)."""
    from ..reports.study_run import annotate_study
    from ..reports.tables import format_table, study_table

    table = study_table(session.name, session.tracking_uri)
    if complete:
        annotate_study(session.name, session.tracking_uri, table=table)
    return format_table(table)


def _worker_loop(session: Session, spec: StudySpec, sampler: ClaimedGridSampler, claims: CellClaims,
                 cells: list[dict[str, Any]], space: Mapping[str, Sequence[Any]], data: dict[str, list] | None,
                 failed_here: set[str], wait: bool) -> None:
    """Claim and run cells until none is open; with `wait`, also wait out the other workers.

    A cell whose trial raised an error in this session (in any worker) is not retried until
    the command runs again; `failed_here` collects them.
    """
    started = time.time()
    while True:
        failed_here |= claims.errored_since(started)
        if data is None and claims.status().open_cells(cells, failed_here):
            # Before claiming: a claim must turn into a trial within seconds, loading takes minutes.
            data = load_data(session.base, session.say)
        cell = claims.claim(cells, skip=failed_here)
        if cell is None:
            status = claims.status()
            if not wait or not (status.running | status.claimed):
                return
            time.sleep(POLL_S)  # another worker runs the last cells; if it dies they open again
            claims.reap()
            session.fail_dead_trial_runs()
            continue
        if data is None:  # a cell opened (its worker died) after the check above
            claims.release()
            continue
        state = _run_cell(session, spec, sampler, claims, cell, space, data)
        if state != TrialState.COMPLETE:
            failed_here.add(cell_key(cell))  # not again in this session: a rerun retries it


def _run_cell(session: Session, spec: StudySpec, sampler: ClaimedGridSampler, claims: CellClaims,
              cell: Mapping[str, Any], space: Mapping[str, Sequence[Any]], data: dict[str, list]) -> TrialState:
    """One trial of the claimed `cell`: the objective is a plain Optuna objective over the grid."""
    ordered = {**{k: cell[k] for k in spec.axes}, SEED_KEY: cell[SEED_KEY]}
    variant, label, seed = variant_label(ordered), cell_label(ordered), int(cell[SEED_KEY])
    baseline = all(ordered[k] == v for k, v in spec.baseline_cell.items())
    sampler.assign(ordered, lambda study, trial: claims.started(
        trial, ordered, {keys.CELL: label, keys.VARIANT: variant, keys.SEED: seed}))

    def objective(trial: optuna.Trial) -> float:
        params = {key: trial.suggest_categorical(key, list(values)) for key, values in space.items()}
        cfg = session.base.override(spec.overrides(params)).validate()
        tags = {keys.CELL: label, keys.SEED: str(seed), keys.VARIANT: variant, keys.BUDGET: session.budget.name,
                keys.BASELINE: str(baseline).lower()}
        result = train_trial(trial, cfg, session, data, name=f"{label}, seed {seed}", tags=tags,
                             run_name=f"{variant} seed {seed}", cell_key=cell_key(params))
        return result.best_val_exprate

    return run_one_trial(session, objective)


def grid_table(study_name: str, tracking_uri: str) -> str:
    """The per-year table of the study from `hmer.reports`: mean ± std over seeds of ExpRate,
    <=1 and <=2, and each variant against the baseline with paired tests over test expressions."""
    from ..reports.tables import format_table, study_table

    return format_table(study_table(study_name, tracking_uri))
