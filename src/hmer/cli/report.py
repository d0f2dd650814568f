"""`hmer report`: a study's (an experiment's, some runs') tables and plots as files; `--list`: every study;
`--claims`: the papers' claims answered from the studies."""

from __future__ import annotations

from ..registry import METRICS
from . import options
from .errors import UserError


def add_parser(sub) -> None:
    rp = sub.add_parser("report", help="per-year ExpRate tables (Markdown, CSV) and plots (PNG)")
    rp.add_argument("--study", default=None, help="an Optuna study / MLflow study name")
    rp.add_argument("--experiment", default=None, help="an MLflow experiment name")
    rp.add_argument("--runs", nargs="*", default=None, metavar="RUN_ID", help="these runs (ids, or their first 8 "
                    "characters at least) in place of a study")
    rp.add_argument("--list", action="store_true", help="list the studies in the store with their state and trials")
    rp.add_argument("--tracking-uri", default=None, help=options.TRACKING_URI)
    rp.add_argument("--out", default=None, help="output folder (default: reports/<name>)")
    rp.add_argument("--analysis", action="store_true",
                    help="also the error analysis per variant (as hmer analyze) into OUT/analysis/")
    rp.add_argument("--published", action="store_true", help="print the papers' published ExpRates alone")
    rp.add_argument("--claims", action="store_true",
                    help="the papers' claims (BTTR, CoMER, the decoder grid) answered from the studies "
                         "<family>-BUDGET in the store: one row per claim and year, with --out also as files")
    rp.add_argument("--frontier", action="store_true",
                    help="the frontier study's points (hold-out ExpRate against training compute) as a table and "
                         "a figure: --study (default frontier-cpu) into --out (default reports/<study>)")
    rp.add_argument("--flops", default=None, help="with --frontier: the measured FLOPs an image (default "
                    "benchmarks/results/frontier_flops.csv, written by benchmarks/frontier_flops.py)")
    rp.add_argument("--budget", default=None, help="with --claims: the studies' budgets, comma-separated (default "
                    "cpu,long: the three-seed cpu rows, then the one-seed long rows where their studies exist)")
    rp.add_argument("--measure", choices=METRICS, default=None,
                    help="the registered metric the differences against the baseline and the paired tests "
                         "are on: exprate, exact readings (a study's default); le1, le2 readings within 1 or 2 "
                         "edits; `hmer models` lists every metric. --claims without it answers each claim on "
                         "ExpRate, then within 1 and 2 errors (on the papers' measure where the runs carry it)")
    rp.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from ..reports.cli import latest_study, list_command, report_command
    from ..tracking.store import existing_store

    if args.published:
        from ..reports.published import format_published

        if args.study or args.experiment or args.runs or args.analysis or args.claims:
            raise UserError("--published prints the published figures alone; drop --study/--experiment/--runs")
        print(format_published("text"), end="")
        return 0
    existing_store(args.tracking_uri)  # every other report reads a store: a mistyped path is not made an empty one
    if args.claims:
        from ..reports.cli import claims_command

        if args.study or args.experiment or args.runs or args.analysis or args.list:
            raise UserError("--claims reads the studies <family>-BUDGET itself; drop --study/--experiment/--runs/"
                            "--analysis/--list (give --budget)")
        if args.budget is not None:  # a budget no study of the store was run at answers nothing
            from ..reports.runs import list_studies

            listed = list_studies(args.tracking_uri)
            studies = list(listed["study"])
            named = [b.strip() for b in args.budget.split(",")]
            unknown = [b for b in named if not any(study.endswith(f"-{b}") for study in studies)]
            if unknown:
                budgets = sorted({str(b) for b in listed.get("budget", []) if isinstance(b, str) and b})
                raise UserError(f"--budget {args.budget}: no study of the store was run at budget {unknown[0]!r} "
                                f"(its studies' budgets: {', '.join(budgets) or 'none'})")
        return claims_command(args.budget, args.tracking_uri, args.out, measure=args.measure)
    if args.frontier:
        from ..reports.frontier import frontier_command
        from ..studies.spec import STUDIES, StudySpec

        if args.experiment or args.runs or args.analysis or args.list:
            raise UserError("--frontier reads one study (--study); drop --experiment/--runs/--analysis/--list")
        try:
            spec = STUDIES.get("frontier")
            planned = (spec.variants or ()) if isinstance(spec, StudySpec) else ()
            return frontier_command(args.study or "frontier-cpu", planned, args.tracking_uri, args.out, args.flops)
        except (FileNotFoundError, LookupError) as exc:
            raise UserError(str(exc)) from None
    if args.flops:
        raise UserError("--flops goes with --frontier")
    if args.budget:
        raise UserError("--budget goes with --claims (a study's budget is part of its name: --study NAME)")
    if args.list:
        return list_command(args.tracking_uri)
    if not (args.study or args.experiment or args.runs):  # as `optuna`/`mlflow` do: a useful default
        args.study = latest_study(args.tracking_uri)
        print(f"hmer report: the latest study, {args.study} (hmer report --list shows them all)", flush=True)
    from ..training.fingerprint import code_fingerprint

    if args.runs:
        from ..tracking.models import RunNotFoundError, run_by_prefix
        from ..tracking.store import mlflow_client

        client = mlflow_client(args.tracking_uri)
        try:
            args.runs = [run_by_prefix(client, given) for given in args.runs]
        except RunNotFoundError as exc:
            raise UserError(str(exc)) from None
    return report_command(study=args.study, experiment=args.experiment, run_ids=args.runs,
                          tracking_uri=args.tracking_uri, out_dir=args.out, analysis=args.analysis,
                          measure=args.measure or "exprate", code_fingerprint=code_fingerprint())
