"""The direction ablation: left-to-right, right-to-left and bidirectional training (BTTR).

Grid: l2r (baseline), r2l, bi, times the seeds of the budget; every other setting held equal.
Each cell is one training run (an MLflow child run of the study's parent run); the
script ends with the per-year ExpRate table (mean and standard deviation over seeds,
within 1 and 2 edits, and the paired difference of each variant against the baseline).

    python studies/ablate_direction.py                   # budget cpu without a GPU, short with one
    python studies/ablate_direction.py --budget paper --n-jobs 2

Run it again to resume. Options: --help, and docs/studies.md.
"""

from ..spec import STUDIES, StudySpec

DIRECTION = StudySpec(
    name="ablate_direction",
    description="decoding direction: left-to-right, right-to-left, bidirectional (BTTR)",
    axes={"model.direction": ("l2r", "r2l", "bi")},
    model_presets={"tiny": "tiny-transformer", "full": "bttr"},
)

STUDIES.register(DIRECTION.name, DIRECTION, description=DIRECTION.description)
