"""The decoder ablation: GRU with coverage attention (WAP), transformer (BTTR), ConvS2S.

Grid: rnn (baseline), transformer, convs2s, times the seeds of the budget; every other setting held equal.
"""

from ..spec import STUDIES, StudySpec

DECODER = StudySpec(
    name="ablate_decoder",
    description="decoder family: GRU with coverage attention (WAP), transformer (BTTR), ConvS2S",
    axes={"model.decoder": ("rnn", "transformer", "convs2s")},
    model_presets={"tiny": "tiny-transformer", "full": "bttr"},
    # ConvS2S's learned token positions come with it from its registration (hmer.model.convs2s).
)

STUDIES.register(DECODER.name, DECODER, description=DECODER.description)
