"""`hmer analyze`: the error analysis of a run's predictions, or of two runs compared."""

from __future__ import annotations

from . import options
from .options import UserError


def add_parser(sub) -> None:
    an = sub.add_parser("analyze", help="error analysis of a run's predictions, or two runs compared")
    an.add_argument("runs", nargs="+", metavar="RUN_ID", help="one run, or two to compare (A then B)")
    an.add_argument("--format", dest="fmt", choices=("markdown", "csv"), default="markdown",
                    help="how the tables are printed (default: markdown)")
    an.add_argument("--out", default=None, help="also write the tables (Markdown, CSV) and a plot here")
    an.add_argument("--top", type=int, default=10, help="token edits listed per kind (default 10)")
    an.add_argument("--tracking-uri", default=None, help=options.TRACKING_URI)
    an.set_defaults(func=cmd_analyze)


def cmd_analyze(args) -> int:
    """The tables on stdout (markdown or csv), and with `--out` every table and the plot as files. An
    unknown run or one without predictions raises a ValueError (`hmer` prints it as one line, exit 2)."""
    import sys

    from ..reports.analysis import analyze, run_expressions, run_label
    from ..reports.runs import NoRunsError, load_runs, resolve_tracking_uri
    from ..tracking.store import existing_store

    if len(args.runs) > 2:
        raise UserError(f"give one run to analyze or two to compare, not {len(args.runs)}")
    if len(args.runs) == 2 and args.runs[0] == args.runs[1]:
        raise ValueError("the two runs to compare are the same run")
    existing_store(args.tracking_uri)  # read alone: a mistyped path is named, not made a new store
    uri = resolve_tracking_uri(args.tracking_uri)
    runs = load_runs(uri, run_ids=list(args.runs), include_parents=True)
    if runs.empty:
        raise NoRunsError(f"no run {', '.join(args.runs)} in the MLflow store {uri}")
    labels = [run_label(runs.iloc[i]) for i in range(len(runs))]
    sides = [run_expressions(run_id, uri, label) for run_id, label in zip(args.runs, labels)]
    result = analyze(sides[0], sides[1] if len(sides) == 2 else None, top=args.top)
    print(result.main_csv() if args.fmt == "csv" else result.markdown("markdown"), end="")
    if args.out is not None:
        written = result.write(args.out, " vs ".join(labels))
        print(f"wrote {len(written)} files to {args.out}", file=sys.stderr)
    return 0
