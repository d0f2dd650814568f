"""Sweeps: TPE over a `SweepSpec`'s search space with median pruning, every trial a training run.

Trials report greedy validation within one edit (`PRUNE_METRIC`) at each quarter of their training;
the median pruner stops those below the median at the same share (PRUNED; MLflow hmer.status=pruned,
run KILLED). A trial failing in a live worker counts as finished. One whose worker died is booked by
the next free worker (`CellBookings.book_continuation`) and continued with its parameters, epochs and
reports from its last checkpoint (`resume.py`), so a sweep killed at a session's end loses no finished
epoch. The lifecycle is `session.run_session`'s; this module says what a sweep is.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..config import Config
from ..data import make_batches
from ..model_presets import Resolution
from ..tracking import keys
from ..training.cost import epochs_for_budget, train_seconds_per_image
from .budgets import StudyBudget
from .bookings import BookedCellSampler, CellBookings
from .objective import run_one_trial, train_trial
from .resolution import cell_resolution, check_cells, range_ends, sweep_trial_values
from .session import Session, StudyData, StudyKind, StudyOutcome, run_session
from .spec import SEED_KEY, SweepSpec
from .sweep_report import sweep_table


def run_sweep(spec: SweepSpec, budget: str | StudyBudget = "smoke", *, storage: str | None = None,
              tracking_uri: str | None = None, n_jobs: int | None = None, data_path: str | None = None,
              data: dict[str, list] | None = None, study_name: str | None = None, n_trials: int | None = None,
              overrides: Mapping[str, Any] | None = None, pruner: optuna.pruners.BasePruner | None = None,
              role: str = "main") -> StudyOutcome:
    """Run (or resume) a TPE sweep with median pruning until `n_trials` trials have finished (with several
    workers, up to n_jobs - 1 more). `pruner` replaces the median pruner of this process's worker. The
    other arguments are `run_grid_study`'s."""
    return run_session(Sweep(spec, n_trials, pruner), budget, storage=storage, tracking_uri=tracking_uri,
                       n_jobs=n_jobs, data_path=data_path, data=data, study_name=study_name, overrides=overrides,
                       role=role)


class Sweep(StudyKind):
    """A sweep: each worker continues a dead worker's trial if one is open, else runs TPE's proposal,
    until `n_trials` have finished; it stops after three failures in a row."""

    name = "sweep"
    objective_name = "validation ExpRate, decoded as the test years (%)"  # `sweep_objective`
    asked = (SEED_KEY,)  # the spec's seed (hmer.studies.resolution), which a resumed sweep must keep

    def __init__(self, spec: SweepSpec, n_trials: int | None, pruner: optuna.pruners.BasePruner | None):
        super().__init__(spec, run_sweep)
        self.requested_trials = n_trials
        self.given_pruner = pruner
        self.failures_in_a_row = 0
        self.continued: FrozenTrial | None = None  # the dead trial this worker's trial in progress continues
        self.objective: Callable[[optuna.Trial], float] | None = None

    def plan(self, budget: StudyBudget) -> int:
        # (the scaled budget's wsd schedule and ink-scale input are no value the sweep searches from)
        outside = [p.name for p in self.spec.params
                   if p.choices and p.name in budget.overrides and budget.overrides[p.name] not in p.choices]
        if outside:
            raise ValueError(f"budget {budget.name!r} fixes {', '.join(outside)} outside what the {self.spec.name} "
                             f"searches; give it another --budget")
        self.n_trials = int(self.requested_trials or budget.sweep_trials)
        return self.n_trials

    def check(self, base: Resolution) -> None:
        check_cells(base, self.spec, range_ends(self.spec, base.config))

    def described(self, base: Config) -> dict[str, Any]:
        flat = base.to_flat_dict()
        self.space: dict[str, str] = {}
        for param in self.spec.params:
            dist = param.distribution(flat)
            self.space[param.name] = f"in {list(dist.choices)}" if hasattr(dist, "choices") else \
                f"in [{dist.low:g}, {dist.high:g}]" + (" (log)" if dist.log else "")
        return {keys.SPACE: self.space, keys.N_TRIALS: self.n_trials}

    def banner(self, budget: StudyBudget, n_trials: int, n_jobs: int, model_preset: str, left: int) -> list[str]:
        lines = []
        m = budget.sweep_trial_cpu_minutes  # a fixed compute per trial: the grid's trial time says nothing
        if m > 0 and not left:
            lines.append(f"budget {budget.name}: {budget.summary}; each trial got {m:g} CPU-minutes of training")
        elif m > 0:
            lines.append(f"budget {budget.name}: {budget.summary}; each trial gets {m:g} CPU-minutes of training "
                         f"(one thread) and trains the epochs that fit, plus greedy validation after each epoch and "
                         f"the final validation decode; {n_trials} trials on {n_jobs} worker(s) take at least "
                         f"{m * math.ceil(n_trials / max(n_jobs, 1)) / 60:.1f} h of training before pruning saves "
                         f"some")
        else:
            lines.append(budget.describe(n_trials, n_jobs, left))
        lines.append(f"  search space: {'; '.join(f'{k} {v}' for k, v in self.space.items())}; {n_trials} trials, "
                     f"TPE + median pruning on validation ExpRate per epoch")
        return lines

    def sampler(self) -> optuna.samplers.BaseSampler:
        # TPE proposes; a trial that continues a dead one takes its parameters as a booked cell
        self.cell_sampler = BookedCellSampler(optuna.samplers.TPESampler(
            multivariate=True, constant_liar=True, n_startup_trials=max(2, min(10, self.n_trials // 3))))
        return self.cell_sampler

    def pruner(self, n_trials: int) -> optuna.pruners.BasePruner:
        # pruning from half of a trial's training on (steps are % of its training, see PRUNE_STEPS)
        return self.given_pruner or optuna.pruners.MedianPruner(n_startup_trials=max(2, n_trials // 5),
                                                                n_warmup_steps=50)

    def worker_options(self) -> dict[str, Any]:
        return {"n_trials": self.n_trials}

    def take_up(self, bookings: CellBookings, dead: list[FrozenTrial]) -> str:
        continued = [t for t in dead if keys.CELL_KEY in t.user_attrs]
        return f"{len(continued)} continue from their last epoch, the others are replaced"

    def done(self, bookings: CellBookings) -> int:
        return _finished_trials(bookings.study)

    def open_trials(self, bookings: CellBookings) -> bool:
        return _finished_trials(bookings.study) < self.n_trials

    def run_next(self, session: Session, data: StudyData) -> bool:
        if self.failures_in_a_row >= 3 or not self.open_trials(session.bookings):
            return False
        if self.objective is None:
            self.objective = _objective(session, self.spec, data, lambda: self.continued)
        bookings = session.bookings
        self.continued = dead = bookings.book_continuation()
        if dead is not None:
            number = dead.number
            self.cell_sampler.assign(dead.params, lambda study, trial: bookings.continuing(trial, number))
        try:
            state = run_one_trial(session, self.objective)
        finally:
            self.continued = None
            if dead is not None:
                bookings.release()  # already, once the trial named the dead one; here if it never began
        self.failures_in_a_row = self.failures_in_a_row + 1 if state == TrialState.FAIL else 0
        if self.failures_in_a_row >= 3:
            session.say("three trials in a row failed in this worker: stopping it (see the errors above)")
        return True

    def others_running(self, bookings: CellBookings) -> bool:
        return bool(bookings.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

    def table(self, session: Session, outcome: StudyOutcome) -> str:
        return sweep_table(session.study)


# A sweep trial's epochs when its budget gives it CPU-minutes instead: at most this many.
MAX_SWEEP_EPOCHS = 60
# The pruner compares trials at the same share of their training (25, 50, 75, 100 %): trials given the
# same compute train different numbers of epochs.
PRUNE_STEPS = 4
# Greedy validation within one edit: half-way through a CPU trial greedy ExpRate is still 0-1 % (the
# best model read 0.4 % after 4 of 24 epochs), within one edit already 5-15 %; label smoothing changes
# the validation loss's scale between trials.
PRUNE_METRIC = "val_le1"


def _objective(session: Session, spec: SweepSpec, data_for: StudyData,
               continued: Callable[[], FrozenTrial | None]):
    """The sweep's objective: sample, fit the epochs to the trial's compute, train, report each quarter
    for pruning. `continued()` is the dead trial this one continues, or None."""
    base_flat = session.base.config.to_flat_dict()
    cpu_minutes = session.budget.sweep_trial_cpu_minutes

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr(keys.WORKER, session.worker.as_attr())
        dead = continued()  # (the trial's user_attrs were read before its sampler's before_trial wrote them)
        sampled = {param: param.suggest(trial, base_flat) for param in spec.params}
        # what it drew, then the epochs that fit its compute and its shares of training as steps
        drawn = {param.key: value for param, value in sampled.items() if not param.share_of_training}
        name = f"trial {trial.number}"
        cfg = cell_resolution(session.base, spec, drawn, name).config
        data = data_for(cfg)
        epochs = cfg.train.epochs
        if cpu_minutes > 0:
            if dead is not None and keys.TRIAL_FITTED_EPOCHS in dead.user_attrs:
                per_image = float(dead.user_attrs[keys.TRIAL_CPU_SECONDS_PER_IMAGE])
                epochs = int(dead.user_attrs[keys.TRIAL_FITTED_EPOCHS])
            else:
                per_image = train_seconds_per_image(cfg, data["train"])
                epochs = epochs_for_budget(cpu_minutes * 60, per_image, len(data["train"]), MAX_SWEEP_EPOCHS)
            drawn["train.epochs"] = epochs
            trial.set_user_attr(keys.TRIAL_CPU_SECONDS_PER_IMAGE, per_image)
            trial.set_user_attr(keys.TRIAL_FITTED_EPOCHS, epochs)
            session.say(f"trial {trial.number}: {per_image * 1000:.1f} CPU-ms per training image: "
                        f"{epochs} epochs fit its {cpu_minutes:g} CPU-minutes")
        steps = epochs * len(make_batches(data["train"], cfg.data.batch_pixels, cfg.data.max_batch_size,
                                          shuffle=True, seed=0))
        for param, value in sampled.items():
            if param.share_of_training:
                drawn.update(param.overrides(value, base_flat, training_steps=steps))
        cfg = cell_resolution(session.base, spec, drawn, name).config
        label = ",".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in sweep_trial_values(spec, session.base.config, drawn).items())
        trial.set_user_attr(keys.CELL, label)
        trial.set_user_attr(keys.CELL_KEY, label)  # what a trial continuing this one must match
        tags = {keys.CELL: label, keys.SEED: str(cfg.train.seed), keys.VARIANT: f"trial {trial.number}",
                keys.BUDGET: session.budget.name}
        reported: set[int] = set()
        for step, value in (dead.intermediate_values.items() if dead is not None else ()):
            trial.report(value, step)  # the dead trial's reports, for the pruner and the history
            reported.add(step)

        def report(epoch: int, metrics: dict[str, float]) -> None:
            value = metrics.get(PRUNE_METRIC)
            if value is None:
                return
            step = 100 * (PRUNE_STEPS * epoch // cfg.train.epochs) // PRUNE_STEPS  # % of training, in quarters
            if step == 0 or step in reported:
                return
            reported.add(step)
            trial.report(value, step)
            # At the end of its training a trial has spent its compute: it is scored, not pruned.
            if step < 100 and trial.should_prune():
                raise optuna.TrialPruned(f"validation within one edit {value:.2f} % after {step} % of its "
                                         f"training (epoch {epoch}) is below the median")

        result = train_trial(trial, cfg, session, data, name=label, tags=tags, run_name=f"trial {trial.number}",
                             cell_key=label, report=report)
        return sweep_objective(result)

    return objective


def sweep_objective(result) -> float:
    """What a sweep maximises: validation decoded as the test years are, averaged with the same writers
    drawn in the `data.val_alt` style where the trial draws another (issue 26); no test year is read.
    Without a final validation decode: the best greedy validation ExpRate."""
    scores = [s.exprate for key, s in sorted(result.validation_scores.items()) if s.n > 0]
    return sum(scores) / len(scores) if scores else result.best_val_exprate


def _finished_trials(study: optuna.Study) -> int:
    """COMPLETE and PRUNED trials, and FAIL ones that failed in a live worker."""
    return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED)
               or (t.state == TrialState.FAIL and keys.ERROR in t.user_attrs)
               for t in study.get_trials(deepcopy=False))
