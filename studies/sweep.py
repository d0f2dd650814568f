"""A hyperparameter sweep: TPE over the learning rate, dropout, model width, batch pixel budget
and weight decay, with median pruning on the validation ExpRate of every epoch.

Pruned trials are PRUNED in Optuna and tagged hmer.status=pruned (run KILLED) in MLflow.
The objective is the best validation ExpRate (never a test year); the table at the end
lists every trial with its test scores.

    python studies/sweep.py                          # budget cpu without a GPU, short with one
    python studies/sweep.py --budget short --trials 24 --n-jobs 3

Run it again to resume (killed trials are replaced). Options: --help, and docs/studies.md.
"""

import sys

from hmer.studies import SWEEP
from hmer.studies.cli import main

if __name__ == "__main__":
    sys.exit(main(SWEEP, doc=__doc__))
