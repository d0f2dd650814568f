"""The coverage ablation: CoMER's attention refinement with no, self, cross and fusion coverage.

Grid: none (baseline), self, cross, fusion, times the seeds of the budget; every other setting held equal.
Each cell is one training run (an MLflow child run of the study's parent run); the
script ends with the per-year ExpRate table (mean and standard deviation over seeds,
within 1 and 2 edits, and the paired difference of each variant against the baseline).

    python studies/ablate_coverage.py                   # budget cpu without a GPU, short with one
    python studies/ablate_coverage.py --budget paper --n-jobs 2

Run it again to resume. Options: --help, and docs/studies.md.
"""

from ..spec import STUDIES, StudySpec

COVERAGE = StudySpec(
    name="ablate_coverage",
    description="CoMER attention refinement: no coverage, self, cross, fusion",
    axes={"model.coverage": ("none", "self", "cross", "fusion")},
    model_presets={"tiny": "tiny-comer", "full": "comer-fusion"},
)

STUDIES.register(COVERAGE.name, COVERAGE, description=COVERAGE.description)
