"""`hmer study NAME`: run a registered study; `run_study(name)` is all a script in `studies/` calls.

Running the same command again resumes the study. Exit status: 0 when the study is
complete, 1 when cells failed (run again to retry them), 2 on bad options.

It runs the study (`hmer.studies`), then presents it in both UIs (`hmer.store.present`, the store's
upkeep, which sits above the studies) and prints the link that compares its runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Sequence

from .options import EXIT_USAGE

if TYPE_CHECKING:
    from ..studies.spec import StudySpec, SweepSpec

EXIT_INCOMPLETE = 1
# What every grid study does, said once under each grid's own `--help` text (its module's docstring).
GRID_EPILOG = """Each cell is one training run (an MLflow child run of the study's parent run); the study ends
with the per-year ExpRate table (mean and standard deviation over seeds, within 1 and 2 edits, and
the paired difference of each variant against the baseline).
"""


def add_parser(sub) -> None:
    p = sub.add_parser("study", help="run (or resume) a registered study, then present it: hmer study NAME "
                       "[options]; hmer study NAME --help lists its options",
                       description="Run (or resume) the registered study NAME, as python studies/NAME.py does.")
    p.add_argument("name", metavar="NAME", nargs="?", help="a registered study (ablate_direction, sweep, ...)")
    # (everything after NAME, --help included, is the study's: its own parser reads it)
    p.add_argument("options", nargs=argparse.REMAINDER, help="the study's own options (hmer study NAME --help)")
    p.set_defaults(func=cmd_study)


def cmd_study(args) -> int:
    from ..studies.spec import STUDIES

    if args.name is None or args.name.startswith("-") or args.name not in STUDIES:
        given = f"unknown study {args.name!r}; " if args.name and not args.name.startswith("-") else ""
        print(f"usage: hmer study NAME [options]: {given}NAME is one of {', '.join(STUDIES)}", file=sys.stderr)
        return EXIT_USAGE
    return run_study(args.name, args.options, prog=f"hmer study {args.name}")


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    """"3" -> three seeds (1, 2, 3); "7,8,9" -> those seeds; None -> the budget's."""
    if not text:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: a count (3) or a list of integers (7,8,9)") from None
    if len(values) == 1 and "," not in text:
        if values[0] < 1:
            raise argparse.ArgumentTypeError("--seeds needs at least one seed")
        return tuple(range(1, values[0] + 1))
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--seeds {text!r} repeats a seed")
    return tuple(values)


def parse_variants(text: str) -> tuple[str, ...]:
    """"none,fusion" -> ("none", "fusion"); the study checks that it has them."""
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    if not items:
        raise argparse.ArgumentTypeError("--variants needs at least one variant")
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"--variants {text!r} repeats a variant")
    return items


def _study_name(text: str) -> str:
    from ..studies.spec import check_study_name

    try:
        return check_study_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser(spec: StudySpec | SweepSpec, doc: str | None = None,
                 prog: str | None = None) -> argparse.ArgumentParser:
    from ..studies.budgets import BUDGET_NAMES
    from ..studies.spec import SweepSpec

    sweep = isinstance(spec, SweepSpec)
    p = argparse.ArgumentParser(
        prog=prog or f"studies/{spec.name}.py", description=doc or spec.description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=("" if sweep else GRID_EPILOG) + "Run the same command again to resume a killed study. See "
                                                "docs/studies.md.")
    p.add_argument("--budget", dest="budget", choices=BUDGET_NAMES, default=None,
                   help="compute budget (default: short on a GPU, cpu otherwise; smoke: a 3-minute "
                        "pipeline check)")
    p.add_argument("--storage", default=None,
                   help="Optuna RDB URL shared by all workers, e.g. postgresql://user:pw@host/db "
                        "(default: SQLite optuna.db beside the MLflow store)")
    p.add_argument("--n-jobs", type=int, default=None,
                   help="worker processes on this machine, side by side (default: the budget's)")
    p.add_argument("--data", default=None, help="dataset folder or zip (default: the usual search, see README)")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: sqlite mlruns/mlflow.db)")
    p.add_argument("--study-name", default=None, type=_study_name,
                   help=f"letters, digits, '_', '.' or '-' (default: {spec.name}-<budget>)")
    if sweep:
        p.add_argument("--trials", type=int, default=None, help="finished trials to aim for (default: the budget's)")
    else:
        p.add_argument("--seeds", type=parse_seeds, default=None,
                       help="seed axis: a count (3 = seeds 1,2,3) or a list (7,8,9); default: the budget's")
        p.add_argument("--variants", type=parse_variants, default=None,
                       help="train only these variants, the baseline among them, e.g. none,fusion (default: every "
                            "variant of the grid; two axes: rnn/l2r)")
        p.add_argument("--train-every-cell", action="store_true",
                       help="train a cell even where another study in the store has trained its config and "
                            "seed (by default that run is copied: hmer.studies.objective)")
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides held equal in every trial, e.g. train.epochs=2")
    return p


def run_study(name: str, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the registered study `name` with the options `argv` (default: the command line); its module's
    docstring (`hmer.studies.suite.<name>`), else its description, is the `--help` text."""
    from ..studies import suite
    from ..studies.spec import STUDIES

    spec = STUDIES.get(name)
    module = sys.modules.get(f"{suite.__name__}.{name}")
    return main(spec, argv, doc=module.__doc__ if module is not None else None, prog=prog)


def main(spec: StudySpec | SweepSpec, argv: Sequence[str] | None = None, doc: str | None = None,
         prog: str | None = None) -> int:
    """Parse the options, run the study, print its table, present it; returns the exit status."""
    args = build_parser(spec, doc, prog).parse_args(argv)
    import optuna

    from ..allocator import tune_malloc
    from ..config import parse_overrides
    from ..signals import stop_on_signals
    from ..studies.budgets import pick_budget
    from ..studies.grid import run_grid_study
    from ..studies.spec import SweepSpec
    from ..studies.storage import StorageUnreachable
    from ..studies.sweeps import run_sweep

    tune_malloc()  # as `hmer` does: the bi cell trained about 7 % faster (docs/benchmarks.md section 0)

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the runner prints every trial itself
    try:
        with stop_on_signals():  # SIGTERM as Ctrl-C: the trial in progress closes KILLED, resumable
            try:
                if args.n_jobs is not None and args.n_jobs < 1:
                    raise ValueError("--n-jobs must be at least 1")
                budget, why = pick_budget(args.budget)
                print(f"using {why}", flush=True)
                common = dict(storage=args.storage, tracking_uri=args.tracking_uri, n_jobs=args.n_jobs,
                              data_path=args.data, study_name=args.study_name,
                              overrides=parse_overrides(args.overrides))
                if isinstance(spec, SweepSpec):
                    outcome = run_sweep(spec, budget, n_trials=args.trials, **common)
                else:
                    outcome = run_grid_study(spec, budget, seeds=args.seeds, variants=args.variants,
                                             reuse=not args.train_every_cell, **common)
            except StorageUnreachable as exc:  # the database stayed down: nothing is lost, the study resumes
                print(f"{spec.name}: error: {exc}; run the same command to resume once it is back", file=sys.stderr)
                return EXIT_INCOMPLETE
            except (ValueError, KeyError, FileNotFoundError, ImportError) as exc:  # ImportError: a storage's driver
                missing = isinstance(exc, ImportError) and "DB access" in str(exc)
                hint = " (for postgresql:// URLs: pip install psycopg2-binary)" if missing else ""
                print(f"{spec.name}: error: {exc}{hint}", file=sys.stderr)
                return EXIT_USAGE
            present(outcome)
            return 0 if outcome.complete else EXIT_INCOMPLETE
    except KeyboardInterrupt as exc:
        print(f"{spec.name}: {'stopped by ' + exc.signal_name if hasattr(exc, 'signal_name') else 'interrupted'}; "
              f"run the same command to resume", file=sys.stderr)
        return getattr(exc, "exit_status", 130)


def present(outcome) -> None:
    """Present the study of `outcome` (a `StudyOutcome`) in both UIs, its trials ended, and print its link."""
    from ..reports.runs import study_parent
    from ..store.present import present_study
    from ..store.study_run import comparison_metric
    from ..tracking.ui import ui_hint

    name, uri = outcome.study_name, outcome.tracking_uri
    present_study(name, tracking_uri=uri, storage=outcome.storage)
    parent = study_parent(name, uri)
    if parent is not None and outcome.table:
        print(ui_hint(uri, str(parent["experiment_id"]), order_by=comparison_metric(name, uri)), flush=True)
