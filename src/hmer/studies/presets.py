"""The older name of `hmer.studies.budgets` (study budgets were once called study presets).

Kept so that code importing `hmer.studies.presets` still runs; new code imports `budgets`.
"""

from .budgets import (  # noqa: F401 - re-exported under the old names
    BUDGET_NAMES, BUDGETS, CROHME_TRAIN_EXPRESSIONS, PRESET_NAMES, PRESETS, StudyBudget, StudyPreset, get_budget,
    get_preset, pick_budget, pick_preset,
)
