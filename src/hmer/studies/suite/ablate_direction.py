"""The direction ablation: left-to-right, right-to-left and bidirectional training (BTTR).

Grid: l2r (baseline), r2l, bi, times the seeds of the budget; every other setting held equal.
"""

from ..spec import STUDIES, StudySpec

DIRECTION = StudySpec(
    name="ablate_direction",
    description="decoding direction: left-to-right, right-to-left, bidirectional (BTTR)",
    axes={"model.direction": ("l2r", "r2l", "bi")},
    model_presets={"tiny": "tiny-transformer", "full": "bttr"},
)

STUDIES.register(DIRECTION.name, DIRECTION, description=DIRECTION.description)
