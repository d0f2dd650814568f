"""The sweep: what learns most per CPU-minute. TPE over the learning rate, warm-up, schedule,
batch size, label smoothing, dropout, rendering height and style, scale and renderer
augmentation, and the encoder's and decoder's width and depth, with median pruning.

With `--budget cpu` every trial gets the same training compute (25 CPU-minutes of one thread):
it measures its own cost per image and trains the epochs that fit. The objective is validation
(the writer hold-out decoded as the test years are, and, for a trial trained on direct
renderings, its mean with the same writers drawn standard-like); no test year is read. Pruned
trials are PRUNED in Optuna and tagged hmer.status=pruned (run KILLED) in MLflow; the pruner
compares trials at the same share of their training.

    python studies/sweep.py                          # budget cpu without a GPU, short with one
    python studies/sweep.py --budget cpu --n-jobs 1  # one worker; run it once per core

Run it again to resume (killed trials are replaced). Options: --help, and docs/studies.md.
"""

from ...recipes import RENDERER_AUGMENTATION
from ..spec import STUDIES, SweepParam, SweepSpec

SWEEP = SweepSpec(
    name="sweep",
    description=("what learns most per CPU-minute: TPE over the learning rate, warm-up, schedule, batch size, "
                 "label smoothing, dropout, rendering height and style, scale and renderer augmentation, "
                 "encoder and decoder width and depth; every trial gets the same training compute (the "
                 "budget's sweep_trial_cpu_minutes) and trains the epochs that fit it"),
    params=(
        SweepParam("train.lr", low=1 / 4, high=4.0, log=True, relative=True),
        SweepParam("train.warmup_steps", low=0.0, high=0.15, share_of_training=True),
        SweepParam("train.schedule", choices=("cosine", "plateau")),
        SweepParam("data.max_batch_size", choices=(8, 16, 32), integer=True, scales=("data.batch_pixels",)),
        SweepParam("train.label_smoothing", low=0.0, high=0.2),
        SweepParam("model.dropout", low=0.0, high=0.3),
        SweepParam("model.encoder_dropout", low=0.0, high=0.2),
        SweepParam("data.render_height", choices=(48, 64, 80), integer=True),
        SweepParam("data.scale_aug_max", choices=(0.0, 1.4)),
        SweepParam("data.render_style", choices=("direct", "standard-like")),
        SweepParam("data.aug_share", low=0.0, high=1.0),
        SweepParam("model.growth_rate", choices=(8, 12, 16), integer=True),
        SweepParam("model.num_dense_layers", choices=(3, 4, 6), integer=True),
        SweepParam("model.d_model", choices=(0.75, 1.0, 1.5), relative=True, integer=True,
                   scales=("model.dim_feedforward",)),
        SweepParam("model.num_decoder_layers", choices=(1, 2, 3), integer=True),
    ),
    model_presets={"tiny": "tiny-transformer", "full": "bttr"},
    # Scale augmentation is CoMER's range x0.7 .. x1.4; renderer augmentation redraws `data.aug_share` of
    # the training images (hmer.recipes.RENDERER_AUGMENTATION). Validation is also drawn standard-like,
    # and the objective reads both (sweeps.sweep_objective); no test year is decoded.
    fixed={"data.scale_aug_min": 0.7, "data.test_years": "", "data.val_alt": "standard-like",
           **RENDERER_AUGMENTATION},
)

STUDIES.register(SWEEP.name, SWEEP, description=SWEEP.description)
