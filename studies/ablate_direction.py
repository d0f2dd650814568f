"""The direction ablation, run from a checkout. The study itself (its spec, what it varies and measures) is
src/hmer/studies/suite/ablate_direction.py; `python studies/ablate_direction.py --help` lists the options."""

import sys

from hmer.cli.study import run_study

if __name__ == "__main__":
    sys.exit(run_study("ablate_direction"))
