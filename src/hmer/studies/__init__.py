"""Optuna studies: grid ablations and a TPE sweep over real training runs, tracked in MLflow.

The modules: docs/studies.md's table. The store's upkeep is `hmer.store`'s, the command `hmer.cli.study`.
A study is found by its name alone, `STUDIES.get("ablate_direction")`, and `ablations()` are the grid
studies by name: the registry is read from `hmer.studies.suite` when first asked, so that no list of
studies is kept here.
"""

from __future__ import annotations

from .budgets import BUDGET_NAMES, BUDGETS, StudyBudget, get_budget, pick_budget
from .grid import run_grid_study
from .objective import train_trial
from .session import StudyOutcome
from .spec import STUDIES, StudySpec, SweepParam, SweepSpec, ablations
from .storage import default_storage
from .sweeps import run_sweep

__all__ = [
    "BUDGETS", "BUDGET_NAMES", "STUDIES", "StudyBudget", "StudyOutcome", "StudySpec", "SweepParam", "SweepSpec",
    "ablations", "default_storage", "get_budget", "pick_budget", "run_grid_study", "run_sweep", "train_trial",
]
