"""The studies of the suite, one module each: a module holds its study's spec (`StudySpec` or
`SweepSpec`), the description `--help` prints (its docstring), and registers the spec in
`hmer.studies.spec.STUDIES` under its name, which is the module's name. Every module here is
imported when the registry is first read, so a new study needs no line anywhere else:

    STUDIES.get("ablate_direction")            # its spec
    hmer study ablate_direction                # runs it, as python studies/ablate_direction.py does
"""

from ...registry import import_submodules

import_submodules(__name__, __path__)
