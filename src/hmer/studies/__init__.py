"""Optuna studies: grid ablations and a TPE sweep over real training runs, tracked in MLflow.

The modules: docs/studies.md's table. The store's upkeep is `hmer.store`'s, the command `hmer.cli.study`.
The studies' constants (`DIRECTION`, `SWEEP`, any a module of `suite` binds) and `ABLATIONS` are read
from `hmer.studies.suite` when first asked for, so that no list of studies is kept here.
"""

from __future__ import annotations

import sys
from typing import Any

from .budgets import BUDGET_NAMES, BUDGETS, StudyBudget, get_budget, pick_budget
from .grid import run_grid_study
from .objective import train_trial
from .session import StudyOutcome
from .spec import STUDIES, StudySpec, SweepParam, SweepSpec, ablations
from .storage import default_storage
from .sweeps import run_sweep

__all__ = [
    "BUDGETS", "BUDGET_NAMES", "STUDIES", "StudyBudget", "StudyOutcome", "StudySpec", "SweepParam", "SweepSpec",
    "default_storage", "get_budget", "pick_budget", "run_grid_study", "run_sweep", "train_trial",
]


def __getattr__(name: str) -> Any:
    """`ABLATIONS`, or a study by the constant its module binds it to (`DIRECTION`, `SWEEP`)."""
    if name == "ABLATIONS":
        return ablations()
    constants = study_constants()
    if name not in constants:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return constants[name]


def study_constants() -> dict[str, StudySpec | SweepSpec]:
    """Every study by the upper-case name its module of `hmer.studies.suite` binds it to (a study registered
    elsewhere has none)."""
    found = {}
    for study in STUDIES:  # the first lookup imports every module of the suite
        module = sys.modules.get(f"{__name__}.suite.{study}")
        found.update({attr: value for attr, value in vars(module or object()).items()
                      if attr.isupper() and value is STUDIES.get(study)})
    return found
