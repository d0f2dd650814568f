"""`python -m hmer.cli ...` (and `torchrun -m hmer.cli ...`): the `hmer` command."""

import sys

from . import main

sys.exit(main())
