"""Sweeps: TPE over a `SweepSpec`'s search space with median pruning, every trial a training run.

    outcome = run_sweep(SWEEP, "short", n_jobs=3)         # python studies/sweep.py

Trials report their greedy validation reading within one edit (`PRUNE_METRIC`) at each quarter of
their training; the median pruner stops the ones below the median of the finished trials at the
same share of their training (Optuna state PRUNED, MLflow tag hmer.status=pruned, run KILLED).
A trial that fails in a live worker (diverged, out of memory) counts as finished. One whose worker
died is marked FAIL and continued: the worker that finds it dead enqueues a trial with the same
parameters, epochs and pruning reports (`continue_dead_trials`), and that trial continues the dead
one's MLflow run from its last epoch's checkpoint (`resume.py`), as a grid cell does. A sweep
killed at the end of a session thus loses no finished epoch.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Callable, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..config import Config
from ..data import make_batches
from ..tracking import keys
from ..training.cost import epochs_for_budget, train_seconds_per_image
from ..tracking.store import mask_password
from ..tracking.ui import ui_hint
from .budgets import StudyBudget
from .claims import CellClaims, Worker
from .mlflow_runs import finish_parent
from .objective import run_one_trial, train_trial
from .session import (POLL_S, Session, StudyOutcome, base_config, load_data, open_session, open_study, resolve,
                      set_threads, start_workers)
from .spec import SEED_KEY, SweepSpec
from .storage import mask_url, open_storage, study_exists


def run_sweep(
    spec: SweepSpec,
    budget: str | StudyBudget = "smoke",
    *,
    storage: str | None = None,
    tracking_uri: str | None = None,
    n_jobs: int | None = None,
    data_path: str | None = None,
    data: dict[str, list] | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    role: str = "main",
) -> StudyOutcome:
    """Run (or resume) a TPE sweep with median pruning until `n_trials` trials have finished.

    With several workers the study may end up to n_jobs - 1 trials over `n_trials`. `pruner`
    replaces the median pruner (the extra workers of n_jobs keep the median pruner). The other
    arguments are those of `run_grid_study`.
    """
    injected = data is not None  # data given in memory serves every trial as it is
    setup = resolve(spec.name, budget, n_jobs=n_jobs, data=data, study_name=study_name, role=role,
                    tracking_uri=tracking_uri, storage=storage)
    budget, n_jobs, name, main, say = setup.budget, setup.n_jobs, setup.name, setup.main, setup.say
    n_trials = int(n_trials or budget.sweep_trials)
    model_preset = spec.model_preset(budget.model_size)
    base = base_config(model_preset, budget, n_trials, n_jobs, spec.fixed, overrides,
                       data_path).override({SEED_KEY: spec.seed})
    spec.check_space(base)  # a range that leaves what its key allows is refused before any trial
    space = {p.name: _describe_param(p, base.to_flat_dict()) for p in spec.params}
    if main:
        say(f"study {name}: {spec.description}")
        if budget.sweep_trial_cpu_minutes > 0:
            # The grid's trial time says nothing of a sweep whose trials get a fixed compute.
            m = budget.sweep_trial_cpu_minutes
            say(f"budget {budget.name}: {budget.summary}; each trial gets {m:g} CPU-minutes of training "
                f"(one thread) and trains the epochs that fit, plus greedy validation after each epoch and "
                f"the final validation decode; {n_trials} trials on {n_jobs} worker(s) take at least "
                f"{m * math.ceil(n_trials / max(n_jobs, 1)) / 60:.1f} h of training before pruning saves some")
        else:
            say(budget.describe(n_trials, n_jobs))
        say(f"  search space: {'; '.join(f'{k} {v}' for k, v in space.items())}; {n_trials} trials, "
            f"TPE + median pruning on validation ExpRate per epoch")
        say(f"  Optuna storage {mask_url(setup.storage_url)}; MLflow {mask_password(setup.tracking_uri)}, "
            f"experiment {name}")

    if data is None and not study_exists(setup.storage_url, name):
        data = load_data(base, say)  # bad data fails here, before a study or an MLflow run exists
    sampler = optuna.samplers.TPESampler(multivariate=True, constant_liar=True,
                                         n_startup_trials=max(2, min(10, n_trials // 3)))
    # pruning from half of a trial's training on (steps are % of its training, see PRUNE_STEPS)
    pruner = pruner or optuna.pruners.MedianPruner(n_startup_trials=max(2, n_trials // 5), n_warmup_steps=50)
    attrs = {keys.SPEC: spec.name, keys.BUDGET: budget.name, keys.SPACE: space, keys.EXPERIMENT: name,
             keys.N_TRIALS: n_trials}
    store = open_storage(setup.storage_url)
    study, base, created = open_study(setup, store, kind="sweep", sampler=sampler, pruner=pruner, attrs=attrs,
                                      base=base)
    worker = Worker.current()
    claims = CellClaims(study, worker, store)  # used only to find the trials of dead workers
    reaped = claims.reap()
    continued = continue_dead_trials(study, reaped)
    if reaped and main:
        say(f"resuming: trial(s) {', '.join(str(t.number) for t in reaped)} of a dead worker marked FAIL; "
            f"{len(continued)} continue from their last epoch, the others are replaced")
    session = open_session(
        setup, store, study, base, created, worker,
        params={"study": name, "kind": "sweep", "spec": spec.name, "preset": budget.name,
                "space": json.dumps(space), "n_trials": n_trials, "storage": mask_url(setup.storage_url),
                "model_preset": model_preset},
        tags={keys.BUDGET: budget.name, keys.KIND: "sweep", keys.VARIANT: spec.name},
        artifact={"spec": spec.name, "description": spec.description, "space": space, "n_trials": n_trials,
                  "config": base.to_flat_dict()},
        reopen=_finished_trials(study) < n_trials)

    loaded: dict[tuple, dict[str, list]] = {}

    def data_for(cfg) -> dict[str, list]:
        """The data a trial's config loads: the process's own unless the trial renders differently."""
        if injected or cfg.data.loading_key() == base.data.loading_key():
            return data
        key = cfg.data.loading_key()
        if key not in loaded:
            loaded[key] = load_data(cfg, say)  # from the rendered cache after the first time
        return loaded[key]

    children: list = []
    failures_in_a_row = 0
    interrupted = False
    try:
        if data is None and _finished_trials(study) < n_trials:
            data = load_data(base, say)  # once per process; the extra workers then read the warm cache
        if main:
            children = start_workers(run_sweep, spec, budget, n_jobs, setup.storage_url, setup.tracking_uri,
                                     data_path, name, overrides, n_trials=n_trials)
        set_threads(n_jobs)
        while _finished_trials(study) < n_trials:
            if data is None:  # a trial of a dead worker must be replaced after all
                data = load_data(base, say)
            state = run_one_trial(session, _objective(session, spec, data_for))
            failures_in_a_row = failures_in_a_row + 1 if state == TrialState.FAIL else 0
            if failures_in_a_row >= 3:
                say("three trials in a row failed in this worker: stopping it (see the errors above)")
                break
            continue_dead_trials(study, claims.reap())
            session.fail_dead_trial_runs()
        if main:
            while study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                time.sleep(POLL_S)  # the other workers' last trials
                continue_dead_trials(study, claims.reap())
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: the trial in progress is marked FAIL; run the same command to resume")
        raise
    finally:
        for child in children:
            if interrupted:  # a SIGTERM sent to this process alone: the workers stop their trials too
                child.terminate()
            child.join()
        n_finished = _finished_trials(study)
        complete = n_finished >= n_trials
        if main:
            session.fail_dead_trial_runs()
            finish_parent(session.client, study, session.parent_run_id, complete, [], interrupted)
    outcome = StudyOutcome(study_name=name, storage=setup.storage_url, tracking_uri=setup.tracking_uri,
                           experiment=name, parent_run_id=session.parent_run_id, complete=complete,
                           n_complete=n_finished, n_expected=n_trials)
    if main:
        outcome.table = sweep_table(study)
        print(outcome.table, flush=True)
        say(ui_hint(setup.tracking_uri, session.experiment_id))
    return outcome


# A sweep trial's epochs when the budget gives it CPU-minutes instead: at most this many.
MAX_SWEEP_EPOCHS = 60
# The pruner compares trials at the same share of their training (steps 25, 50, 75, 100 %), not
# at the same epoch: trials given the same compute run different numbers of epochs.
PRUNE_STEPS = 4
# What the pruner compares: the greedy validation share read within one edit. Half-way through a
# CPU trial, greedy ExpRate is still 0-1 % for most settings (the committed best model read 0.4 %
# after 4 of its 24 epochs), too coarse to rank trials; within one edit it is already 5-15 %. The
# validation loss would be finer still, but label smoothing changes its scale between trials.
PRUNE_METRIC = "val_le1"


def continue_dead_trials(study: optuna.Study, dead: list[FrozenTrial]) -> list[FrozenTrial]:
    """Enqueue, for each trial whose worker died after it had started training, a trial with its
    parameters that names it (`keys.CONTINUES`). The next free worker runs it: it takes the dead
    trial's measured cost and fitted epochs (measured again, the epochs could differ and the
    checkpoint would no longer match) and pruning reports, and continues its run from its
    checkpoint. Returns the trials continued. Only the
    worker that marked a trial FAIL gets it from `CellClaims.reap`, so each is enqueued once."""
    continued = []
    for t in dead:
        if keys.CELL_KEY not in t.user_attrs:
            continue  # died before its configuration was complete: TPE samples a new trial
        study.enqueue_trial(t.params, user_attrs={keys.CONTINUES: t.number}, skip_if_exists=False)
        continued.append(t)
    return continued


def _objective(session: Session, spec: SweepSpec, data_for: Callable[[Config], dict[str, list]]):
    """The sweep's objective: sample the spec's parameters, fit the epochs to the trial's compute,
    train, report at each quarter of the training for pruning."""
    base_flat = session.base.to_flat_dict()
    cpu_minutes = session.budget.sweep_trial_cpu_minutes

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr(keys.WORKER, session.worker.as_attr())
        continues = trial.user_attrs.get(keys.CONTINUES)  # set by continue_dead_trials
        dead = next(t for t in session.study.get_trials(deepcopy=False) if t.number == continues) \
            if continues is not None else None
        sampled = {param: param.suggest(trial, base_flat) for param in spec.params}
        values: dict[str, Any] = {}
        for param, value in sampled.items():
            if not param.share_of_training:
                values.update(param.overrides(value, base_flat))
        cfg = spec.sampled_config(session.base, values, trial.number)
        data = data_for(cfg)
        if cpu_minutes > 0:
            if dead is not None and keys.TRIAL_FITTED_EPOCHS in dead.user_attrs:
                per_image = float(dead.user_attrs[keys.TRIAL_CPU_SECONDS_PER_IMAGE])
                values["train.epochs"] = int(dead.user_attrs[keys.TRIAL_FITTED_EPOCHS])
            else:
                per_image = train_seconds_per_image(cfg, data["train"])
                values["train.epochs"] = epochs_for_budget(cpu_minutes * 60, per_image, len(data["train"]),
                                                           MAX_SWEEP_EPOCHS)
            trial.set_user_attr(keys.TRIAL_CPU_SECONDS_PER_IMAGE, per_image)
            trial.set_user_attr(keys.TRIAL_FITTED_EPOCHS, values["train.epochs"])
            session.say(f"trial {trial.number}: {per_image * 1000:.1f} CPU-ms per training image: "
                        f"{values['train.epochs']} epochs fit its {cpu_minutes:g} CPU-minutes")
        cfg = spec.sampled_config(session.base, values, trial.number)
        steps = cfg.train.epochs * len(make_batches(data["train"], cfg.data.batch_pixels, cfg.data.max_batch_size,
                                                    shuffle=True, seed=0))
        for param, value in sampled.items():
            if param.share_of_training:
                values.update(param.overrides(value, base_flat, training_steps=steps))
        cfg = spec.sampled_config(session.base, values, trial.number)
        label = ",".join(f"{k}={_short(v)}" for k, v in values.items())
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
            if trial.should_prune():
                raise optuna.TrialPruned(f"validation within one edit {value:.2f} % after {step} % of its "
                                         f"training (epoch {epoch}) is below the median")

        result = train_trial(trial, cfg, session, data, name=label, tags=tags, run_name=f"trial {trial.number}",
                             cell_key=label, report=report)
        return sweep_objective(result)

    return objective


def sweep_objective(result) -> float:
    """What a sweep maximises: the validation ExpRate decoded as the test years are (beam, joint
    search), averaged with the same writers drawn in the other style (`data.val_alt`) when the trial
    has it, so that a setting must read both renderers' strokes (issue 26) and no test year is read.
    Without a final validation decode: the best greedy validation ExpRate of the epochs."""
    scores = [s.exprate for key, s in sorted(result.validation_scores.items()) if s.n > 0]
    return sum(scores) / len(scores) if scores else result.best_val_exprate


def _describe_param(param, base_flat: Mapping[str, Any]) -> str:
    dist = param.distribution(base_flat)
    if hasattr(dist, "choices"):
        return f"in {list(dist.choices)}"
    return f"in [{dist.low:g}, {dist.high:g}]" + (" (log)" if dist.log else "")


def _finished_trials(study: optuna.Study) -> int:
    """COMPLETE and PRUNED trials, and FAIL ones that failed in a live worker (a real outcome)."""
    count = 0
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            count += 1
        elif t.state == TrialState.FAIL and keys.ERROR in t.user_attrs:
            count += 1
    return count


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def sweep_table(study: optuna.Study) -> str:
    """The sweep's trials, best objective first (then pruned ones), with their parameters: the
    objective (`sweep_objective`), how far each trial trained and its pruning reading there."""
    import pandas as pd

    rows = []
    for t in study.get_trials(deepcopy=False):
        last = max(t.intermediate_values) if t.intermediate_values else None
        # Optuna gives a pruned trial its last report as its value: that is the pruning metric,
        # not the objective, and stays in "val <=1 then".
        objective = t.value if t.state == TrialState.COMPLETE and t.value is not None else math.nan
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name, "objective": objective,
                               "trained %": last if last is not None else math.nan,
                               "val <=1 then": t.intermediate_values[last] if last is not None else math.nan}
        for key, value in t.user_attrs.items():
            if key.startswith("test_") and key.endswith("_exprate"):
                row[key[len("test_"):-len("_exprate")] + " ExpRate"] = value
        row.update({k: _short(v) for k, v in t.params.items()})
        rows.append(row)
    if not rows:
        return "(no trials)"
    # finished trials by their objective, then pruned ones by how far and how well they got
    df = pd.DataFrame(rows).sort_values(["objective", "trained %", "val <=1 then"], ascending=False,
                                        na_position="last")
    counts = ", ".join(f"{n} {s.lower()}" for s, n in df["state"].value_counts().items())
    return f"sweep {study.study_name}: {len(df)} trials ({counts})\n" + df.to_string(index=False, float_format="%.2f")
