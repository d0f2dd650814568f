"""The frontier study (issue 66), run from a checkout. The study itself (its spec, what it
varies and measures) is src/hmer/studies/suite/frontier.py; `python studies/frontier.py
--help` lists the options."""

import sys

from hmer.cli.study import run_study

if __name__ == "__main__":
    sys.exit(run_study("frontier"))
