"""The image positional-encoding ablation: 2-D sinusoidal, learned, CAPE, none.

Grid: sin2d (baseline), learned, cape, none, times the seeds of the budget; every other setting held equal.
Each cell is one training run (an MLflow child run of the study's parent run); the
script ends with the per-year ExpRate table (mean and standard deviation over seeds,
within 1 and 2 edits, and the paired difference of each variant against the baseline).

    python studies/ablate_posenc.py                   # budget cpu without a GPU, short with one
    python studies/ablate_posenc.py --budget paper --n-jobs 2

Run it again to resume. Options: --help, and docs/studies.md.
"""

from ..spec import STUDIES, StudySpec

POSENC = StudySpec(
    name="ablate_posenc",
    description="image positional encoding: 2-D sinusoidal, learned, CAPE, none",
    axes={"model.image_pos": ("sin2d", "learned", "cape", "none")},
    model_presets={"tiny": "tiny-transformer", "full": "bttr"},
)

STUDIES.register(POSENC.name, POSENC, description=POSENC.description)
