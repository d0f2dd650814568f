"""The counting ablation (issue 68): does CAN's symbol counting help, and does it help a transformer?

Grid: the GRU with coverage attention (WAP, CAN's own decoder, left to right as CAN-DWAP) and the
bidirectional transformer (BTTR), each without and with CAN's counting module (`model.counting`,
hmer.model.counting), and a parameter-matched control: the transformer without counting, its
feed-forward layers widened from 384 to 588 so that it has the counting transformer's parameters
(1,749,773 against 1,750,317 at the `swept` size), so that a gain cannot be read as capacity alone. Times
the seeds of the budget; every other setting held equal. The transformer's cells without counting at
the width of 384 are the other studies' bi transformer cells, field for field, and are copied from them
where the store has them trained by code of today's fingerprint (docs/studies.md, "Cells that studies
share"); the GRU's left-to-right cells are no other study's and train here.
"""

from ..spec import STUDIES, StudySpec

MATCHED_FEEDFORWARD = 588  # the transformer's FFN width at which it has the counting transformer's parameters

COUNTING = StudySpec(
    name="ablate_counting",
    description="CAN's symbol counting with the GRU (WAP) and the transformer (BTTR), and a parameter-matched control",
    axes={"model.decoder": ("rnn", "transformer"), "model.counting": (False, True),
          "model.dim_feedforward": (384, MATCHED_FEEDFORWARD)},
    model_presets={"tiny": "tiny-transformer", "full": "bttr"},
    # The GRU decodes left to right, as CAN-DWAP does (and at a third of the bi GRU's cost on a CPU: the
    # decoder study's bi GRU cells took 2.6-2.7 CPU-hours each at the `cpu` budget); the transformer is
    # bidirectional, as BTTR.
    linked={"model.decoder": {"rnn": {"model.direction": "l2r"}}},
    variants=("rnn/False/384", "rnn/True/384", "transformer/False/384", "transformer/True/384",
              f"transformer/False/{MATCHED_FEEDFORWARD}"),
)

STUDIES.register(COUNTING.name, COUNTING, description=COUNTING.description)
