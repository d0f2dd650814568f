"""Optuna studies: grid ablations and a TPE sweep over real training runs, tracked in MLflow.

    from hmer.studies import DIRECTION, run_grid_study
    outcome = run_grid_study(DIRECTION, "smoke")      # = python studies/ablate_direction.py --preset smoke

See `runner` (running and resuming a study), `claims` (why no grid cell runs twice),
`spec` (what each study varies) and `presets` (smoke / short / paper).
"""

from .presets import PRESETS, StudyPreset, get_preset, pick_preset
from .runner import StudyOutcome, default_storage, run_grid_study, run_sweep
from .spec import ABLATIONS, COVERAGE, DECODER, DIRECTION, ENCODER, POSENC, SWEEP, StudySpec, SweepParam, SweepSpec

__all__ = [
    "ABLATIONS", "COVERAGE", "DECODER", "DIRECTION", "ENCODER", "POSENC", "PRESETS", "SWEEP", "StudyOutcome",
    "StudyPreset", "StudySpec", "SweepParam", "SweepSpec", "default_storage", "get_preset", "pick_preset",
    "run_grid_study", "run_sweep",
]
