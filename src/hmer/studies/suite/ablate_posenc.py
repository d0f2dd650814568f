"""The image positional-encoding ablation: 2-D sinusoidal, learned, CAPE, none.

Grid: sin2d (baseline), learned, cape, none, times the seeds of the budget; every other setting held equal.
"""

from ..spec import STUDIES, StudySpec

POSENC = StudySpec(
    name="ablate_posenc",
    description="image positional encoding: 2-D sinusoidal, learned, CAPE, none",
    axes={"model.image_pos": ("sin2d", "learned", "cape", "none")},
    model_presets={"tiny": "tiny-transformer", "full": "bttr"},
)

STUDIES.register(POSENC.name, POSENC, description=POSENC.description)
