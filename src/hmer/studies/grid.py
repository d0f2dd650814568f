"""Grid studies: every (variant, seed) cell of a `StudySpec` trained once, then the per-year table.

Running it again resumes: dead workers' trials go FAIL and their cells run again, from the last
checkpoint where there is one (`resume.py`); no COMPLETE cell runs twice, with any number of workers
(`bookings.py`). The lifecycle is `session.run_session`'s; this module says what a grid is.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from ..config import Config
from ..model_presets import Resolution
from ..tracking import keys
from .budgets import StudyBudget
from .bookings import BookedCellSampler, CellBookings, describe_cell_key
from .objective import copy_trial, find_trained, run_one_trial, train_trial
from .resolution import cell_resolution, check_cells
from .session import Session, StudyData, StudyKind, StudyOutcome, run_session
from .spec import SEED_KEY, StudySpec, cell_key, cell_label, variant_label


def run_grid_study(spec: StudySpec, budget: str | StudyBudget = "smoke", *, storage: str | None = None,
                   tracking_uri: str | None = None, n_jobs: int | None = None, data_path: str | None = None,
                   data: dict[str, list] | None = None, study_name: str | None = None,
                   seeds: Sequence[int] | None = None, variants: Sequence[str] | None = None,
                   overrides: Mapping[str, Any] | None = None, print_table: bool = True, reuse: bool = True,
                   role: str = "main") -> StudyOutcome:
    """Run (or resume) the grid study `spec` under `budget` until every cell is COMPLETE (not presented
    in the UIs: `hmer.store.present.present_study`).

    Args:
        budget: smoke, cpu, long, short or paper, or a StudyBudget.
        storage: an RDB URL shared by every worker; default SQLite beside the MLflow store.
        tracking_uri: the MLflow store; default `hmer.tracking.store.default_tracking_uri()`.
        n_jobs: worker processes on this machine (default: the budget's); each loads the data.
        data_path: the dataset (folder or zip); `data`: loaded splits for a single worker (tests).
        study_name: default "<spec name>-<budget>".
        seeds: the seed axis; default the budget's.
        variants: only these variants (`spec.variant_label`), the baseline among them; default all.
        overrides: Config overrides held equal in every cell (`--set`).
        reuse: copy a cell another study of the store trained with the same config and seed (`objective.py`).
        role: "main" prints banner and table and waits for the others; "worker" only runs trials."""
    return run_session(Grid(spec, seeds, print_table, reuse, variants), budget, storage=storage,
                       tracking_uri=tracking_uri, n_jobs=n_jobs, data_path=data_path, data=data,
                       study_name=study_name, overrides=overrides, role=role)


class Grid(StudyKind):
    """A grid study: each worker books an open cell and runs it as one trial; a cell whose trial raised
    an error in this command is not retried until the command runs again."""

    name = "grid"
    # the trial's value: the checkpoint's best (greedy) validation ExpRate
    objective_name = "best validation ExpRate (%)"
    noun, done_word = "cells", "complete"

    def __init__(self, spec: StudySpec, seeds: Sequence[int] | None, print_table: bool, reuse: bool,
                 variants: Sequence[str] | None = None):
        super().__init__(spec, run_grid_study)
        self.requested_seeds = seeds
        self.variants = tuple(variants) if variants else spec.variants
        self.print_table = print_table
        self.reuse = reuse
        self.failed_here: set[str] = set()  # cell keys
        self.since: float | None = None  # when this worker began running cells

    def plan(self, budget: StudyBudget) -> int:
        self.seeds = tuple(int(s) for s in (self.requested_seeds or budget.seeds))
        self.cells = self.spec.cells(self.seeds, self.variants)
        self.space = self.spec.search_space(self.seeds, self.variants)
        return len(self.cells)

    def check(self, base: Resolution) -> None:
        check_cells(base, self.spec, self.cells)

    def described(self, base: Config) -> dict[str, Any]:
        return {keys.GRID: self.space, keys.BASELINE: self.spec.baseline_cell}

    def banner(self, budget: StudyBudget, n_trials: int, n_jobs: int, model_preset: str, left: int) -> list[str]:
        n_seeds = len(self.seeds)
        return [budget.describe(n_trials, n_jobs, left),
                f"  grid: {', '.join(f'{k} in {list(v)}' for k, v in self.space.items())} = {n_trials} trials "
                f"({n_seeds} seed{'s' if n_seeds > 1 else ''} per variant); baseline "
                f"{cell_label(self.spec.baseline_cell)}; model preset {model_preset}"]

    def sampler(self) -> BookedCellSampler:
        self.cell_sampler = BookedCellSampler()
        return self.cell_sampler

    def worker_options(self) -> dict[str, Any]:
        return {"seeds": self.seeds, "print_table": False, "reuse": self.reuse, "variants": self.variants}

    def take_up(self, bookings: CellBookings, dead: list) -> str:
        return "their cells run again"  # they are open: the next booking takes them

    def done(self, bookings: CellBookings) -> int:
        complete = bookings.status().complete
        return sum(cell_key(c) in complete for c in self.cells)

    def open_trials(self, bookings: CellBookings) -> bool:
        return bool(bookings.status().open_cells(self.cells, set()))

    def run_next(self, session: Session, data: StudyData) -> bool:
        bookings = session.bookings
        if self.since is None:
            self.since = time.time()
        self.failed_here |= bookings.errored_since(self.since)
        # Load a cell's data before booking it: a booking must become a trial within seconds, loading takes
        # minutes.
        upcoming = bookings.status().open_cells(self.cells, self.failed_here)
        if upcoming:
            data(cell_resolution(session.base, self.spec, upcoming[0]).config)  # loaded now, if not yet
        cell = bookings.book(self.cells, skip=self.failed_here)
        if cell is None:
            return False
        cfg = cell_resolution(session.base, self.spec, cell).config
        if not data.has(cfg):  # another cell than the one loaded for (a worker died, a race was lost)
            bookings.release()
            return True
        if self._run_cell(session, cell, cfg, data(cfg)) != TrialState.COMPLETE:
            self.failed_here.add(cell_key(cell))  # not again in this command: a rerun retries it
        return True

    def others_running(self, bookings: CellBookings) -> bool:
        status = bookings.status()
        return bool(status.running | status.booked)

    def failed(self) -> list[str]:
        return [describe_cell_key(k) for k in sorted(self.failed_here)]

    def table(self, session: Session, outcome: StudyOutcome) -> str:
        session.say(f"study {outcome.study_name}: {outcome.n_complete} of {outcome.n_expected} cells complete"
                    + ("" if outcome.complete else f"; failed: {'; '.join(outcome.failed) or 'none here'} "
                       f"(run the same command to retry them)"))
        from ..reports.tables import format_table, study_table

        return format_table(study_table(session.name, session.tracking_uri))

    def _run_cell(self, session: Session, cell: Mapping[str, Any], cfg: Config, data: dict[str, list]) -> TrialState:
        """One trial of the booked `cell`, which trains `cfg`: a plain Optuna objective over the grid."""
        spec, space, bookings = self.spec, self.space, session.bookings
        ordered = {**{k: cell[k] for k in spec.axes}, SEED_KEY: cell[SEED_KEY]}
        variant, label, seed = variant_label(ordered), cell_label(ordered), int(cell[SEED_KEY])
        baseline = all(ordered[k] == v for k, v in spec.baseline_cell.items())
        self.cell_sampler.assign(ordered, lambda study, trial: bookings.started(
            trial, ordered, {keys.CELL: label, keys.VARIANT: variant, keys.SEED: seed}))
        tags = {keys.CELL: label, keys.SEED: str(seed), keys.VARIANT: variant, keys.BUDGET: session.budget.name,
                keys.BASELINE: str(baseline).lower()}
        named: dict[str, Any] = {"name": f"{label}, seed {seed}", "tags": tags, "run_name": f"{variant} seed {seed}"}

        def objective(trial: optuna.Trial) -> float:
            for key, values in space.items():  # the booked cell's values (the sampler's), the trial's params
                trial.suggest_categorical(key, list(values))
            trained = find_trained(session.client, cfg, session.name) if self.reuse else None
            if trained is not None:
                return copy_trial(trial, session, trained, **named)
            return train_trial(trial, cfg, session, data, cell_key=cell_key(cell), **named).best_val_exprate

        return run_one_trial(session, objective)
