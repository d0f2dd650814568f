"""Optuna studies: grid ablations and a TPE sweep over real training runs, tracked in MLflow.

    from hmer.studies import DIRECTION, run_grid_study
    outcome = run_grid_study(DIRECTION, "smoke")      # = python studies/ablate_direction.py --budget smoke

See `grid` and `sweeps` (running and resuming a study), `objective` (the one objective both
share), `resume` (a killed trial continues from its checkpoint), `claims` (why no grid cell runs
twice), `spec` (what each study varies) and `budgets` (smoke / cpu / short / paper).
"""

from .budgets import BUDGET_NAMES, BUDGETS, StudyBudget, get_budget, pick_budget
from .grid import run_grid_study
from .objective import train_trial
from .session import StudyOutcome
from .spec import ABLATIONS, COVERAGE, DECODER, DIRECTION, ENCODER, POSENC, SWEEP, StudySpec, SweepParam, SweepSpec
from .storage import default_storage
from .sweeps import run_sweep

__all__ = [
    "ABLATIONS", "BUDGETS", "BUDGET_NAMES", "COVERAGE", "DECODER", "DIRECTION", "ENCODER", "POSENC", "SWEEP",
    "StudyBudget", "StudyOutcome", "StudySpec", "SweepParam", "SweepSpec", "default_storage", "get_budget",
    "pick_budget", "run_grid_study", "run_sweep", "train_trial",
]
