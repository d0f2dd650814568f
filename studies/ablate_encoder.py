"""The encoder ablation: where the project's encoder departs from the reference code.

Grid: model.mask_padding (False: BTTR/CoMER, True: padding masked through every stride) x
model.encoder_tail (relu-norm-pos: BTTR, pos-norm: CoMER) x model.image_pos (sin2d-bttr:
BTTR's sinusoids, sin2d: CoMER's), baseline BTTR's code (False, relu-norm-pos, sin2d-bttr),
times the seeds of the budget; every other setting held equal. 8 variants per seed.
Each cell is one training run (an MLflow child run of the study's parent run); the
script ends with the per-year ExpRate table (mean and standard deviation over seeds,
within 1 and 2 edits, and the paired difference of each variant against the baseline).

    python studies/ablate_encoder.py                   # budget cpu without a GPU, short with one
    python studies/ablate_encoder.py --budget paper --n-jobs 2

Run it again to resume. Options: --help, and docs/studies.md.
"""

import sys

from hmer.studies import ENCODER
from hmer.studies.cli import main

if __name__ == "__main__":
    sys.exit(main(ENCODER, doc=__doc__))
