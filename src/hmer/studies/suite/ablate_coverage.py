"""The coverage ablation: CoMER's attention refinement with no, self, cross and fusion coverage.

Grid: none (baseline), self, cross, fusion, times the seeds of the budget; every other setting held equal.
"""

from ..spec import STUDIES, StudySpec

COVERAGE = StudySpec(
    name="ablate_coverage",
    description="CoMER attention refinement: no coverage, self, cross, fusion",
    axes={"model.coverage": ("none", "self", "cross", "fusion")},
    model_presets={"tiny": "tiny-comer", "full": "comer-fusion"},
)

STUDIES.register(COVERAGE.name, COVERAGE, description=COVERAGE.description)
