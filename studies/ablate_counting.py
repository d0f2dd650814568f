"""The counting ablation (issue 68), run from a checkout. The study itself (its spec, what it
varies and measures) is src/hmer/studies/suite/ablate_counting.py; `python studies/ablate_counting.py
--help` lists the options."""

import sys

from hmer.cli.study import run_study

if __name__ == "__main__":
    sys.exit(run_study("ablate_counting"))
