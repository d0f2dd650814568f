"""What a CPU-hour buys: the input scale, the model width and the training length, measured as a
frontier of validation ExpRate against training compute (issue 66).

Grid: model width (the `swept` size's d 192; d 256 with growth 16 and FFN 512) x input scale (`0.0`:
today's fixed 48 px high; 0.5 and 0.7: drawn at that multiple of the standard images' own scale, so a
symbol keeps one size across expressions) x weight average (off; 0.999) x epochs (8, 16, 32, 64), CoMER's
fusion coverage, bidirectional, fp32 on every host, one seed. Only the planned variants train
(`variants` below), in their order; the rest of the grid is there to be named.

Every cell trains the `wsd` schedule: the `swept` recipe's warm-up and rate, held until the last fifth of
its epochs and then decayed (1 - sqrt). Before its decay a cell computes what the longer cells of its
variant compute, so each longer cell starts where the shorter one's decay began (`hmer.studies.resume.find_branch`):
the four lengths of a variant cost its longest stable phase plus the four decays, not the sum of four
runs, where the state is still on the machine (it is never committed).

No test year is decoded: the frontier reads the writer hold-out (validation decoded with beam 10 and
the joint search, `val_final_exprate`), never a test year; the best setting is then trained as its own
budget and scored on the test years. `hmer report --frontier` draws the figure.

    python studies/frontier.py --budget cpu --seeds 1 --n-jobs 1     # one worker, one thread
"""

from ..spec import STUDIES, StudySpec

# The epochs of a cell and the last of them in which its rate decays (a fifth, rounded).
LENGTHS = {8: 2, 16: 3, 32: 6, 64: 13}
WIDE = {"model.growth_rate": 16, "model.dim_feedforward": 512}  # with d_model 256: the wider model

FRONTIER = StudySpec(
    name="frontier",
    description="what a CPU-hour buys: input scale x model width x epochs, WSD schedules, fusion coverage",
    axes={
        "model.d_model": (192, 256),
        "data.render_scale": (0.0, 0.5, 0.7),
        "train.ema_decay": (0.0, 0.999),
        "train.epochs": tuple(LENGTHS),
    },
    model_presets={"tiny": "tiny-comer", "full": "comer-fusion"},
    fixed={"model.coverage": "fusion", "train.precision": "fp32", "data.test_years": ""},
    linked={
        "model.d_model": {256: WIDE},
        "data.render_scale": {scale: {"data.render_height": 0} for scale in (0.5, 0.7)},
        "train.epochs": {epochs: {"train.schedule": "wsd", "train.decay_epochs": decay}
                         for epochs, decay in LENGTHS.items()},
    },
    # Each input's lengths in a row on one worker, each starting where the one before began to decay.
    # Planned to the 40 CPU-hours on the 2-core AVX2 host of 2026-12-02 (48 px: 9.6 CPU-min an
    # epoch): the three inputs' 8/16/32-epoch chains (about 6, 8 and 12 CPU-hours, measured 16.5 for the
    # first eight points), then the 64-epoch cell of the input that still gains (0.7: 48 px flattens, 43.7
    # at 0.5 PFLOP and the long budget's 44.7 at 1.6), from the 32-epoch cell's stable phase (about 8
    # CPU-hours more on the Xeon of 2026-12-06): the best CPU model (the `scaled` budget,
    # `hmer.studies.budgets`, trains it from scratch); then the wider model and the weight
    # average at 8 epochs, the wider model at 16 if the cap leaves room; then the wider model at 0.7 and
    # 8 epochs (about 2.5 CPU-hours), which says whether width still pays at the input that pays most. The
    # grid names every value of every axis, as the study began with (a resumed study must search the
    # space it began with).
    variants=(
        *(f"192/{scale}/0.0/{e}" for scale in ("0.0", "0.5", "0.7") for e in (8, 16, 32)),
        "192/0.7/0.0/64", "256/0.5/0.0/8", "192/0.5/0.999/8", "256/0.5/0.0/16", "256/0.7/0.0/8",
    ),
)

STUDIES.register(FRONTIER.name, FRONTIER, description=FRONTIER.description)
