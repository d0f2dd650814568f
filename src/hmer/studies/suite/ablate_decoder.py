"""The decoder ablation: GRU with coverage attention (WAP), transformer (BTTR), ConvS2S.

Grid: rnn (baseline), transformer, convs2s, times the seeds of the budget; every other setting held equal.
Each cell is one training run (an MLflow child run of the study's parent run); the
script ends with the per-year ExpRate table (mean and standard deviation over seeds,
within 1 and 2 edits, and the paired difference of each variant against the baseline).

    python studies/ablate_decoder.py                   # budget cpu without a GPU, short with one
    python studies/ablate_decoder.py --budget paper --n-jobs 2

Run it again to resume. Options: --help, and docs/studies.md.
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
