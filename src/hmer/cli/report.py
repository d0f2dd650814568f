"""`hmer report`: a study's (an experiment's, some runs') tables and plots as files; `--list`: every study;
`--claims`: the papers' claims answered from the studies; `--frontier`: the frontier study's points.
`hmer analyze`: the error analysis of a run's predictions, or of two runs compared.

writes table.md, table.csv, runs.csv and plots/*.png (docs/reports.md lists them; with `--analysis`
also `analysis/`), and prints the text table and the link that compares the runs in the MLflow UI.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..registry import METRICS
from . import options
from .options import UserError

if TYPE_CHECKING:
    import pandas as pd

EXIT_OK = 0
EXIT_NOTHING_SCORED = 1


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
                    help="the papers' claims answered from the studies <family>-BUDGET: a row per claim and year")
    rp.add_argument("--frontier", action="store_true",
                    help="the frontier study's points (hold-out ExpRate against training compute), table and "
                         "figure: --study (default frontier-cpu) into --out (default reports/<study>)")
    rp.add_argument("--flops", default=None, help="with --frontier: the measured FLOPs an image (default "
                    "benchmarks/results/frontier_flops.csv, written by benchmarks/frontier_flops.py)")
    rp.add_argument("--budget", default=None, help="with --claims: the studies' budgets, comma-separated (default "
                    "cpu,long: the three-seed cpu rows, then the one-seed long rows where their studies exist)")
    rp.add_argument("--metric", choices=METRICS, default=None,
                    help="the metric (`hmer models`) of the differences against the baseline and the paired "
                         "tests (default: exprate; --claims: exprate, le1 and le2 in turn)")
    rp.set_defaults(func=cmd_report)
    an = sub.add_parser("analyze", help="error analysis of a run's predictions, or two runs compared")
    an.add_argument("runs", nargs="+", metavar="RUN_ID", help="one run, or two to compare (A then B)")
    an.add_argument("--format", dest="fmt", choices=("markdown", "csv"), default="markdown",
                    help="how the tables are printed (default: markdown)")
    an.add_argument("--out", default=None, help="also write the tables (Markdown, CSV) and a plot here")
    an.add_argument("--top", type=int, default=10, help="token edits listed per kind (default 10)")
    an.add_argument("--tracking-uri", default=None, help=options.TRACKING_URI)
    an.set_defaults(func=cmd_analyze)


def cmd_report(args) -> int:
    from ..tracking.store import existing_store

    if args.published:
        from ..reports.published import format_published

        if args.study or args.experiment or args.runs or args.analysis or args.claims:
            raise UserError("--published prints the published figures alone; drop --study/--experiment/--runs")
        print(format_published("text"), end="")
        return 0
    existing_store(args.tracking_uri)  # every other report reads a store: a mistyped path is not made an empty one
    if args.claims:
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
        return claims_command(args.budget, args.tracking_uri, args.out, metric=args.metric)
    if args.frontier:
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
        args.study = str(_studies(args.tracking_uri, "; give --experiment NAME or --runs ID")[1].loc[0, "study"])
        print(f"hmer report: the latest study, {args.study} (hmer report --list shows them all)", flush=True)
    from ..training.fingerprint import code_fingerprint

    if args.runs:
        from ..tracking.models import run_by_prefix
        from ..tracking.store import mlflow_client

        client = mlflow_client(args.tracking_uri)
        args.runs = [run_by_prefix(client, given) for given in args.runs]
    return report_command(study=args.study, experiment=args.experiment, run_ids=args.runs,
                          tracking_uri=args.tracking_uri, out_dir=args.out, analysis=args.analysis,
                          metric=args.metric or "exprate", code_fingerprint=code_fingerprint())


def cmd_analyze(args) -> int:
    """The tables on stdout (markdown or csv), and with `--out` every table and the plot as files. An
    unknown run or one without predictions raises a ValueError (`hmer` prints it as one line, exit 2)."""
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


def out_folder(out_dir: str | Path | None, name: str) -> Path:
    """`out_dir`, else `reports/<name>` under the project root (the checkout, else the current folder); made."""
    import re

    from ..tracking.store import project_root

    safe = re.sub(r"[^A-Za-z0-9._=-]+", "_", name).strip("_") or "report"
    out = Path(out_dir) if out_dir else project_root() / "reports" / safe
    out.mkdir(parents=True, exist_ok=True)
    return out


def runs_summary(runs: pd.DataFrame, years: Sequence[str]) -> pd.DataFrame:
    """One row per run: the columns a reader checks a table against."""
    from ..tracking import keys

    cols = {"run_id": "run_id", "variant": "variant", "seed": "seed", "trial": "trial", "state": "state",
            "run_name": "run_name", f"tags.{keys.DEVICE}": "device", f"tags.{keys.GIT_COMMIT}": "git_commit",
            f"tags.{keys.FINGERPRINT}": "fingerprint"}
    for year in years:
        for m in (*METRICS.names(), "n"):
            cols[f"metrics.test_{year}_{m}"] = f"test_{year}_{m}"
    for m in ("best_val_exprate", "gpu_minutes", "train_seconds", "cpu_seconds", "train_images_per_second",
              "num_params"):
        cols[f"metrics.{m}"] = m
    present = [c for c in cols if c in runs.columns]
    return runs[present].rename(columns=cols)


def code_notes(runs: pd.DataFrame, today: str) -> list[str]:
    """Which runs were trained by code that computes other numbers than today's (fingerprint `today`),
    in words; one line that says so when all share it."""
    import pandas as pd

    from ..tracking import keys

    untagged = pd.Series(None, index=runs.index, dtype=object)
    fingerprint, changed = (runs.get(f"tags.{tag}", untagged) for tag in (keys.FINGERPRINT, keys.FINGERPRINT_CHANGED))
    label = runs["variant"].astype(str) + " seed " + runs["seed"].astype(str) + " (" + runs["run_id"].str[:8] + ")"
    groups: dict[str, list[str]] = {}
    for i in runs.index:
        value = fingerprint[i] if isinstance(fingerprint[i], str) and fingerprint[i] else None
        if isinstance(changed[i], str) and changed[i]:
            key = f"other code from a resume on ({changed[i]})"
        elif value is None:
            key = "no fingerprint (not trained by the suite's training code)"
        elif value != today:
            key = f"fingerprint {value}"
        else:
            continue
        groups.setdefault(key, []).append(label[i])
    if not groups:
        return [f"every run was trained by code that computes what today's does (fingerprint {today})"]
    return [f"trained by other code than today's (fingerprint {today}): {key}: {', '.join(names)}"
            for key, names in groups.items()]


def write_report(runs: pd.DataFrame, table: pd.DataFrame, out_dir: Path, *, name: str,
                 tracking_uri: str | None = None) -> list[Path]:
    """Write every file of the report (see the module docstring); returns their paths."""
    from ..reports.plots import plot_training_curves
    from ..reports.markup import metric_list
    from ..atomic import save_figure
    from ..reports.plots import plot_exprate
    from ..reports.runs import curve_runs, load_history, scored_years
    from ..reports.tables import format_table, scored

    plots = out_dir / "plots"
    written: list[Path] = []
    order = list(table.index)
    good = runs[scored(runs)] if not runs.empty else runs
    figures: list[tuple[str, str]] = []
    if not good.empty:
        written.append(save_figure(plot_exprate(runs, order=order, title=name), plots / "exprate.png"))
        figures.append(("ExpRate by variant and year", "plots/exprate.png"))
        logged = [m for m in METRICS.names() if any(c.startswith("metrics.test_") and c.endswith(f"_{m}")
                                               and good[c].notna().any() for c in good.columns)]
        written.append(save_figure(plot_exprate(runs, order=order, metrics=logged, title=name), plots / "scores.png"))
        figures.append((f"{metric_list(logged)} by variant and year", "plots/scores.png"))
        history = load_history(curve_runs(runs), tracking_uri=tracking_uri)
        if not history.empty:
            written.append(save_figure(plot_training_curves(history, order=order, title=name),
                                       plots / "training_curves.png"))
            figures.append(("Training curves", "plots/training_curves.png"))
    md = [f"# Report: {name}", "", format_table(table, "markdown")]
    md += [f"![{caption}]({rel})\n" for caption, rel in figures]
    (out_dir / "table.md").write_text("\n".join(md))
    table.to_csv(out_dir / "table.csv")
    runs_summary(runs, scored_years(runs)).to_csv(out_dir / "runs.csv", index=False)
    written += [out_dir / "table.md", out_dir / "table.csv", out_dir / "runs.csv"]
    return written


def write_variant_analysis(runs: pd.DataFrame, out: Path, name: str, order: list[str], tracking_uri: str) -> list[Path]:
    """The error analysis per variant (seeds pooled) into `out/analysis/`, linked from table.md."""
    from ..reports.analysis import variant_analysis

    result = variant_analysis(runs, tracking_uri, order=order)
    if result is None:
        print("hmer report: no run has predictions artifacts: no error analysis", file=sys.stderr)
        return []
    print(result.markdown("text"))
    written = result.write(out / "analysis", name)
    with (out / "table.md").open("a") as md:
        md.write("\n[Error analysis by target length and structure, and token edits](analysis/analysis.md)\n")
    return written


def _studies(tracking_uri: str | None, hint: str = ""):
    """The store's URI and its studies (`list_studies`: newest first); `NoRunsError` when it has none."""
    from ..reports.runs import NoRunsError, list_studies, resolve_tracking_uri
    from ..tracking.store import mask_password

    uri = resolve_tracking_uri(tracking_uri)
    studies = list_studies(uri)
    if studies.empty:
        raise NoRunsError(f"no study in the MLflow store {mask_password(uri)}{hint}")
    return uri, studies


def list_command(tracking_uri: str | None = None) -> int:
    """`hmer report --list`: every study in the store, newest first, with its state and trials."""
    import pandas as pd

    from ..tracking.store import mask_password

    uri, studies = _studies(tracking_uri)
    shown = studies.drop(columns=["experiment", "superseded_by"]).copy()
    shown["state"] = shown["state"].fillna("(no parent run)").str.lower()
    superseded = studies["superseded_by"].map(lambda name: isinstance(name, str) and bool(name))
    # a superseded study is not continued: one that stopped unfinished has its parent run closed
    # `incomplete` (hmer runs supersede), or still RUNNING where it was superseded before that did it
    shown.loc[superseded & shown["state"].isin(["running", "incomplete"]), "state"] = "stopped unfinished"
    shown.loc[superseded, "state"] += ", superseded by " + studies.loc[superseded, "superseded_by"]
    shown["started"] = pd.to_datetime(shown["started"]).dt.strftime("%Y-%m-%d %H:%M")
    print(f"{len(shown)} stud{'y' if len(shown) == 1 else 'ies'} in {mask_password(uri)}, newest first:")
    print(shown.to_string(index=False))
    return EXIT_OK


def report_command(study: str | None = None, experiment: str | None = None, run_ids: Sequence[str] | None = None,
                   tracking_uri: str | None = None, out_dir: str | Path | None = None, *,
                   n_resamples: int | None = None, analysis: bool = False, metric: str = "exprate",
                   code_fingerprint: str | None = None) -> int:
    """`hmer report`: tables and plots of a study, an experiment or runs, as files; with `code_fingerprint`
    (today's), the runs trained by other code named. Returns 0, or 1 when no run has test scores (the
    table still written); `NoRunsError` when nothing matches.
    """
    from ..reports.runs import (NoRunsError, load_predictions, load_runs, resolve_tracking_uri, study_parent,
                                study_progress)
    from ..evaluation.significance import DEFAULT_RESAMPLES
    from ..reports.tables import format_table, study_table, variant_table
    from ..store.study_run import comparison_metric
    from ..tracking import keys
    from ..tracking.ui import ui_hint

    n_resamples = DEFAULT_RESAMPLES if n_resamples is None else n_resamples
    name = study or experiment  # the report's name (and default folder)
    if not name:
        if not run_ids:
            raise ValueError("give a study, an experiment or run ids")
        name = f"runs-{run_ids[0][:8]}" + (f"-and-{len(run_ids) - 1}-more" if len(run_ids) > 1 else "")
    uri = resolve_tracking_uri(tracking_uri)
    if study:
        parent = study_parent(study, uri)
        if parent is not None and parent.get(f"tags.{keys.KIND}") == "sweep":
            return sweep_report(study, uri, out_dir)
    runs = load_runs(uri, experiment=experiment, study=study, run_ids=list(run_ids) if run_ids else None)
    if runs.empty:
        what = f"study {study!r}" if study else f"experiment {experiment!r}" if experiment else "those run ids"
        raise NoRunsError(f"no training runs for {what} in the MLflow store {uri}")
    if study:
        table = study_table(study, uri, runs=runs, metric=metric, n_resamples=n_resamples)
    else:
        table = variant_table(runs, predictions=lambda run_id, year: load_predictions(run_id, year, uri),
                              metric=metric, n_resamples=n_resamples, title=name)
    out = out_folder(out_dir, name)
    written = write_report(runs, table, out, name=name, tracking_uri=uri)
    progress = study_progress(study, uri) if study else None
    if progress:
        print(f"study {study}: {progress}; this table is of its finished trials and will change")
    print(format_table(table, "text"))
    if code_fingerprint:
        for line in code_notes(runs, code_fingerprint):
            print(line)
    if analysis:
        written += write_variant_analysis(runs, out, name, list(table.index), uri)
    print(f"wrote {len(written)} files to {out}:")
    for path in written:
        print(f"  {path.relative_to(out)}")
    experiments = runs["experiment_id"].dropna().unique() if "experiment_id" in runs.columns else []
    if len(experiments) == 1:
        print(ui_hint(uri, str(experiments[0]), order_by=comparison_metric(study, uri) if study else None))
    if table.empty or int(table["seeds"].sum()) == 0:
        print(f"hmer report: no run of {name} has test scores (failed, pruned or unfinished)", file=sys.stderr)
        return EXIT_NOTHING_SCORED
    return EXIT_OK


def sweep_report(study: str, tracking_uri: str, out_dir: str | Path | None = None) -> int:
    """`hmer report --study SWEEP`: the sweep's own table (every trial, best first, with its parameters),
    printed and written to `sweep.txt`. Returns 0, or 1 when no trial has an objective yet."""
    from ..atomic import write_text_atomically
    from ..studies.sweep_report import complete_trials, describe_sweep, failures, find_sweep, sweep_table

    sweep = find_sweep(tracking_uri, None, study)
    text = "\n".join([describe_sweep(sweep), "", sweep_table(sweep), *failures(sweep)]) + "\n"
    out = out_folder(out_dir, study)
    write_text_atomically(out / "sweep.txt", text)
    print(text, end="")
    print(f"wrote {out / 'sweep.txt'}; `hmer notebooks sweep` plots its history, importances and slices")
    if not complete_trials(sweep):
        print(f"hmer report: no trial of {study} has an objective yet", file=sys.stderr)
        return EXIT_NOTHING_SCORED
    return EXIT_OK


def claims_command(budgets: str | None = None, tracking_uri: str | None = None, out_dir: str | None = None, *,
                   metric: str | None = None) -> int:
    """`hmer report --claims`: the claims table at `budgets` (comma-separated) on `metric`, else on each
    of `CLAIM_METRICS`; at several budgets also how the same cells read at each (`format_budgets`).
    With `out_dir`, also as files (`claims.png`: the first metric at the first budget). Returns 0: a
    claim without its study is a row saying so."""
    import pandas as pd

    from ..atomic import write_text_atomically
    from ..reports.budget_curves import budget_history, format_budgets, plot_budget_curves
    from ..reports.paper_claims import CLAIM_METRICS, DEFAULT_BUDGETS, claims_table, format_claims
    from ..reports.plots import plot_claims

    tables = [claims_table(budgets or DEFAULT_BUDGETS, tracking_uri, metric=m)
              for m in ([metric] if metric else CLAIM_METRICS)]
    df = tables[0]
    texts = [format_claims(t, "text", sources=i == 0) for i, t in enumerate(tables)]
    history = (budget_history(budgets=df.attrs["budgets"], tracking_uri=tracking_uri)
               if len(df.attrs["budgets"]) > 1 else None)
    if history is not None and not history.empty:
        texts.append("\nThe same cells at each budget (validation ExpRate; test ExpRate, mean over seeds):\n\n"
                     + format_budgets(history, "text"))
    text = "\n".join(texts)
    print(text, end="" if text.endswith("\n") else "\n")
    if out_dir:
        out = out_folder(out_dir, "claims")
        write_text_atomically(out / "claims.md", "\n".join(format_claims(t, "markdown", sources=i == 0)
                                                           for i, t in enumerate(tables)))
        write_text_atomically(out / "claims.csv", pd.concat(tables, ignore_index=True).to_csv(index=False))
        plot_claims(df[df["budget"] == df.attrs["budgets"][0]], path=out / "claims.png")
        written = "claims.md, claims.csv and claims.png"
        if history is not None and not history.empty:
            write_text_atomically(out / "budgets.md", format_budgets(history, "markdown"))
            plot_budget_curves(history, path=out / "budget_curves.png")
            written = "claims.md, claims.csv, claims.png, budgets.md and budget_curves.png"
        print(f"wrote {written} to {out}")
    return 0


def frontier_command(study: str, planned: Sequence[str], tracking_uri: str | None = None,
                     out_dir: str | None = None, flops_path: str | None = None) -> int:
    """`hmer report --frontier`: print the points of `study` (of its `planned` ones) and write them into
    `out_dir` (default reports/<study>). Returns 0, or 1 when no point is finished yet."""
    from ..atomic import save_figure, write_text_atomically
    from ..studies.frontier_report import (budget_points, format_frontier, frontier_points, frontier_summary,
                                           plot_frontier, read_flops)

    flops = read_flops(flops_path)
    points = frontier_points(study, flops, tracking_uri)
    budgets = budget_points(flops, tracking_uri)
    print(frontier_summary(points, planned))
    if points.empty:
        return 1
    text = format_frontier(points)
    if not budgets.empty:
        text += "\n\nWhere today's budgets sit (their fusion cells, 48 px, cosine schedule, mean over seeds):\n\n"
        text += budgets.to_markdown(index=False, floatfmt=".2f")
    print(text)
    out = out_folder(out_dir, study)
    write_text_atomically(out / "frontier.md", f"# {study}: the frontier\n\n{frontier_summary(points, planned)}\n\n"
                          f"{text}\n\n![the frontier](plots/frontier.png)\n")
    write_text_atomically(out / "frontier.csv", points.to_csv(index=False))
    save_figure(plot_frontier(points, title=f"{study}: hold-out ExpRate against training compute", budgets=budgets),
                out / "plots" / "frontier.png")
    print(f"wrote frontier.md, frontier.csv and plots/frontier.png to {out}")
    return 0
