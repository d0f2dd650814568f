"""The encoder ablation: where the project's encoder departs from the reference code.

Grid: model.mask_padding (False: BTTR/CoMER, True: padding masked through every stride) x
model.encoder_tail (relu-norm-pos: BTTR, pos-norm: CoMER) x model.image_pos (sin2d-bttr:
BTTR's sinusoids, sin2d: CoMER's), baseline BTTR's code (False, relu-norm-pos, sin2d-bttr),
times the seeds of the budget; every other setting held equal. 8 variants per seed.
"""

from ..spec import STUDIES, StudySpec

ENCODER = StudySpec(
    name="ablate_encoder",
    description="where the project's encoder departs from BTTR's code: padding mask, tail order, sinusoids",
    # Baseline: BTTR's code (the `bttr` preset). The other values are the project's choices
    # (kept by the tiny presets) and CoMER's tail, in every combination, since they interact:
    # the tail decides whether positions are added before or after the LayerNorm.
    axes={"model.mask_padding": (False, True), "model.encoder_tail": ("relu-norm-pos", "pos-norm"),
          "model.image_pos": ("sin2d-bttr", "sin2d")},
    model_presets={"tiny": "tiny-transformer", "full": "bttr"},
)

STUDIES.register(ENCODER.name, ENCODER, description=ENCODER.description)
