"""Run a study: a grid ablation or a TPE sweep, every trial a real training run.

    outcome = run_grid_study(DIRECTION, "smoke")          # python studies/ablate_direction.py
    outcome = run_sweep(SWEEP, "short", n_jobs=3)         # python studies/sweep.py

The parts, each in a module of its own:

- `storage`: an Optuna storage from a URL (SQLite beside the MLflow store unless `--storage`
  names any RDB URL), with Optuna's heartbeat, waiting out a database restart;
- `session`: one worker's study: created or resumed under one config, its MLflow parent run
  (`mlflow_runs`), the extra worker processes of `n_jobs`;
- `objective`: `train_trial(trial, cfg, ...)`, the one objective grids and sweeps share: a
  trial is one MLflow child run of `hmer.training.train`; a killed trial's cell continues its
  run from the last checkpoint (`resume`);
- `grid` and `sweeps`: the two kinds of study; `claims`: why no grid cell runs twice.

This module keeps the names that callers imported from it before the split.
"""

from .grid import grid_table, run_grid_study
from .mlflow_runs import fail_dead_trial_runs
from .objective import record_result, train_trial
from .session import StudyOutcome, base_config
from .storage import HEARTBEAT_ENV, HEARTBEAT_S, default_storage, heartbeat_s, mask_url, open_storage, study_exists
from .sweeps import run_sweep, sweep_table

__all__ = [
    "HEARTBEAT_ENV", "HEARTBEAT_S", "StudyOutcome", "base_config", "default_storage", "fail_dead_trial_runs",
    "grid_table", "heartbeat_s", "mask_url", "open_storage", "record_result", "run_grid_study", "run_sweep",
    "study_exists", "sweep_table", "train_trial",
]
