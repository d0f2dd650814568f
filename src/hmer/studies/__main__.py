"""`python -m hmer.studies NAME [options]`: run any registered study, as `python studies/NAME.py` does.

Without a name (or with an unknown one) it prints the registered studies and exits 2.
"""

import sys

from .cli import EXIT_USAGE, run_study
from .spec import STUDIES

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in STUDIES:
        given = f"unknown study {sys.argv[1]!r}; " if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""
        print(f"usage: python -m hmer.studies NAME [options]: {given}NAME is one of {', '.join(STUDIES)}",
              file=sys.stderr)
        sys.exit(EXIT_USAGE)
    sys.exit(run_study(sys.argv[1], sys.argv[2:]))
