"""The sweep: what learns most per CPU-minute. TPE over the learning rate, warm-up, schedule,
batch size, label smoothing, dropout, rendering height and style, scale and renderer
augmentation, and the encoder's and decoder's width and depth, with median pruning.

With `--budget cpu` every trial gets the same training compute (25 CPU-minutes of one thread):
it measures its own cost per image and trains the epochs that fit. The objective is validation
(the writer hold-out, drawn in both rendering styles, decoded as the test years are); no test
year is read. Pruned trials are PRUNED in Optuna and tagged hmer.status=pruned (run KILLED) in
MLflow; the pruner compares trials at the same share of their training.

    python studies/sweep.py                          # budget cpu without a GPU, short with one
    python studies/sweep.py --budget cpu --n-jobs 1  # one worker; run it once per core

Run it again to resume (killed trials are replaced). Options: --help, and docs/studies.md.
"""

import sys

from hmer.studies import SWEEP
from hmer.studies.cli import main

if __name__ == "__main__":
    sys.exit(main(SWEEP, doc=__doc__))
