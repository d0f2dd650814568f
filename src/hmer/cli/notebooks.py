"""`hmer notebooks`: the report notebooks executed against a store, saved with their outputs."""

from __future__ import annotations

from .errors import UserError


def add_parser(sub) -> None:
    from ..reports.notebooks import NAMES  # a light module: the names, no notebook machinery

    nb = sub.add_parser("notebooks", help="run the report notebooks against a store and keep their outputs")
    nb.add_argument("names", nargs="*", metavar="NAME", help=f"{', '.join(NAMES)} (default: all {len(NAMES)})")
    nb.add_argument("--study", default=None, help="the study the notebooks show (default: each notebook's own)")
    nb.add_argument("--tracking-uri", default=None, help="the store (default: the project's mlruns/mlflow.db)")
    nb.add_argument("--notebooks", default="notebooks", help="where the notebooks are (default: ./notebooks)")
    nb.add_argument("--out", default=None, help="write the executed notebooks here (default: in place)")
    nb.add_argument("--set", nargs="*", default=[], metavar="VAR=VALUE",
                    help="kernel variables, e.g. HMER_YEAR=2016 HMER_RUNS=RUN_A,RUN_B")
    nb.add_argument("--clear", action="store_true", help="strip the outputs instead: the notebooks as sources")
    nb.set_defaults(func=cmd_notebooks)


def cmd_notebooks(args) -> int:
    from ..reports.notebooks import NAMES, clear_outputs, run_notebooks

    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        raise UserError(f"unknown notebook {', '.join(unknown)}: choose from {', '.join(NAMES)}")
    names = tuple(args.names) or NAMES
    if args.clear:
        for path in clear_outputs(notebooks_dir=args.notebooks, names=names):
            print(f"cleared {path}")
        return 0
    env = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected VAR=VALUE")
        env[key] = value
    from ..tracking.store import existing_store

    existing_store(args.tracking_uri)  # the notebooks read it: a mistyped path is named, not made a new store
    for done in run_notebooks(notebooks_dir=args.notebooks, out_dir=args.out, tracking_uri=args.tracking_uri,
                              study=args.study, names=names, env=env):
        print(f"{done.path}: executed in {done.seconds:.0f} s")
    return 0
