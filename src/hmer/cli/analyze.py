"""`hmer analyze`: the error analysis of a run's predictions, or of two runs compared."""

from __future__ import annotations

from . import options
from .errors import UserError


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
    from ..reports.analysis import analyze_command
    from ..tracking.store import existing_store

    if len(args.runs) > 2:
        raise UserError(f"give one run to analyze or two to compare, not {len(args.runs)}")
    existing_store(args.tracking_uri)  # read alone: a mistyped path is named, not made a new store
    return analyze_command(args.runs, tracking_uri=args.tracking_uri, fmt=args.fmt, out_dir=args.out, top=args.top)
