"""The sweep, run from a checkout. The study itself (its spec, what it varies and measures) is
src/hmer/studies/suite/sweep.py; `python studies/sweep.py --help` lists the options."""

import sys

from hmer.cli.study import run_study

if __name__ == "__main__":
    sys.exit(run_study("sweep"))
