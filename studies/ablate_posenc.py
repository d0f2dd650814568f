"""The image positional-encoding ablation, run from a checkout. The study itself (its spec, what it
varies and measures) is src/hmer/studies/suite/ablate_posenc.py; `python studies/ablate_posenc.py
--help` lists the options."""

import sys

from hmer.cli.study import run_study

if __name__ == "__main__":
    sys.exit(run_study("ablate_posenc"))
