"""`hmer train`: a preset (its model with its recipe, or at a study budget) or a config file, trained and
tracked in MLflow. `hmer config` prints what the same options resolve to, layer by layer. `hmer import`: a
published BTTR or CoMER Lightning checkpoint, read safely and recorded as a run."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from . import options
from .options import UserError, preset_resolution
from .evaluate import print_scores

EXIT_PAUSED = 3  # `hmer train --pause-after-epochs`: checkpointed, to be continued with --resume


def add_parser(sub) -> None:
    tr = sub.add_parser("train", help="train a preset or config file, tracked in MLflow")
    im = sub.add_parser("import", help="record a BTTR or CoMER Lightning checkpoint as a run (read safely)")
    for p in (tr, im):
        p.add_argument("--data", default=None, help=options.DATA)
        p.add_argument("--experiment", default="hmer", help="MLflow experiment (default: hmer)")
        p.add_argument("--tracking-uri", default=None, help=options.TRACKING_URI)
    tr.add_argument("--preset", default=None, help="a preset from `hmer models` (default: bttr)")
    tr.add_argument("--config", default=None, help="a JSON config file (as logged in a run's config.json)")
    tr.add_argument("--recipe", default=None, help="a recipe in place of the preset's own (bttr, comer, swept)")
    tr.add_argument("--budget", default=None, help="a study budget (smoke, cpu, long, short, paper): its size, recipe "
                                                   "and keys, as a study trains its preset (`hmer config` shows them)")
    tr.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE", help=options.SET)
    tr.add_argument("--device", default=None,
                    help="auto, cpu, cuda, cuda:N or mps (train.device; default: the config's)")
    tr.add_argument("--epochs", type=int, default=None, help="epochs to train (train.epochs; default: the config's)")
    # ("budget" alone is a study's compute budget, by name)
    tr.add_argument("--time-budget", dest="time_budget", type=float, default=None, metavar="SECONDS",
                    help="wall-clock limit for training (train.time_budget_s); then it checkpoints and evaluates")
    tr.add_argument("--run-name", default=None, help="the MLflow run's name (default: the preset's name)")
    tr.add_argument("--resume", nargs="?", const="latest", default=None, metavar="RUN_OR_CHECKPOINT",
                    help="continue a killed run with its own config: a run id (8 characters at least), its "
                         "checkpoint file, or alone the latest unfinished run (default: a new run)")
    tr.add_argument("--no-progress", action="store_true",
                    help="one line per epoch instead of progress bars (default: bars on a terminal)")
    tr.add_argument("--pause-after-epochs", type=int, default=None, metavar="N",
                    help="train N epochs, checkpoint and exit with status 3 (continue with --resume)")
    tr.add_argument("--pause-within", type=float, default=None, metavar="SECONDS",
                    help="pause likewise after the last epoch that leaves time for the next within SECONDS")
    tr.add_argument("--final-seconds", type=float, default=None, metavar="SECONDS",
                    help="with --pause-within: the test years' time, counted before the last epoch")
    tr.set_defaults(func=cmd_train)
    im.add_argument("checkpoint", metavar="CHECKPOINT", help="a BTTR or CoMER Lightning checkpoint (.ckpt)")
    im.add_argument("--dictionary", default=None, help="its dictionary.txt (default: the family's own)")
    im.add_argument("--register", default="", metavar="NAME", help="registered model (default: <preset>-reference)")
    im.add_argument("--years", default="", help="test years to score now, e.g. 2014,2016,2019 (default: none)")
    im.add_argument("--limit", type=int, default=0, help="score only the first N of each year")
    im.add_argument("--device", default="auto", help=options.DEVICE)
    im.add_argument("--run-name", default=None, help="the MLflow run's name (default: the checkpoint's file name)")
    im.set_defaults(func=cmd_import)


def check_time_flags(args) -> None:
    """The time and pause flags, before any work: finite, positive, and a window the run can finish in."""
    for flag, value in (("--time-budget", args.time_budget), ("--pause-within", args.pause_within),
                        ("--final-seconds", args.final_seconds)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UserError(f"{flag} {value:g}: give a positive, finite number of seconds"
                            + (" (leave the flag out for no limit)" if flag == "--time-budget" else ""))
    if args.pause_after_epochs is not None and args.pause_after_epochs < 1:
        raise UserError(f"--pause-after-epochs {args.pause_after_epochs}: give a number of epochs, at least 1")
    if args.final_seconds is not None:
        if args.pause_within is None:
            raise UserError(f"--final-seconds {args.final_seconds:g} counts the test years within --pause-within, "
                            "which is not given")
        if args.final_seconds >= args.pause_within:
            raise UserError(f"--final-seconds {args.final_seconds:g} is not less than --pause-within "
                            f"{args.pause_within:g}: the test years alone would not fit the window, and the run "
                            "would pause at every resume without ever finishing")


def cmd_train(args) -> int:
    import time

    from ..config import Config, parse_overrides
    from ..training import train

    check_time_flags(args)
    how: dict[str, Any] = dict(progress=not args.no_progress, pause_after_epochs=args.pause_after_epochs or 0,
                               pause_at=time.time() + args.pause_within if args.pause_within is not None else 0.0,
                               final_seconds=args.final_seconds or 0.0)
    if args.resume is not None:
        from ..tracking.run import fail_runs_of_dead_processes
        from ..tracking.store import existing_store

        check_resume_flags(args)
        uri = existing_store(args.tracking_uri)  # the run's own store: a mistyped path creates none
        for run_id in fail_runs_of_dead_processes(args.experiment, uri):  # a kill -9 left them RUNNING
            print(f"run {run_id}: its process is gone; marked FAILED", file=sys.stderr)
        ckpt = find_resume_checkpoint(args.resume, uri, args.experiment)
        print(f"resuming from {ckpt}", flush=True)
        return print_result(train(Config(), tracking_uri=uri, experiment=args.experiment, resume=ckpt, **how))
    if args.config and args.preset:
        raise UserError("give --preset or --config, not both")
    if args.config and (args.recipe or args.budget):
        raise UserError("--recipe and --budget resolve a --preset; a --config file holds its values (use --set)")
    if args.config:
        cfg = Config.load(args.config)
    else:
        cfg = preset_resolution(args.preset or "bttr", args.budget, args.recipe).config
    overrides = parse_overrides(args.overrides)
    flags = {"data.path": args.data or None, "train.device": args.device or None, "train.epochs": args.epochs,
             "train.time_budget_s": args.time_budget}
    overrides.update({key: str(value) for key, value in flags.items() if value is not None})
    cfg = cfg.override(overrides).validate()
    return print_result(train(cfg, tracking_uri=args.tracking_uri, experiment=args.experiment, run_name=args.run_name,
                              **how))


def cmd_import(args) -> int:
    from ..tracking.reference_checkpoint import import_reference

    years = [y.strip() for y in args.years.split(",") if y.strip()]
    result = import_reference(args.checkpoint, tracking_uri=args.tracking_uri, experiment=args.experiment,
                              run_name=args.run_name, dictionary=args.dictionary, register_as=args.register,
                              data=args.data, years=years, limit=args.limit, device=args.device)
    ref = result.reference
    print(f"run {result.run_id}: {ref.preset} from {ref.path.name} (search rule {ref.config.train.search_rule}"
          + (f", registered as {result.registered}" if result.registered else "") + ")")
    for what, symbols in (("symbols only the reference has (appended)", ref.mapping.reference_only),
                          ("project symbols it never predicts", ref.mapping.project_only)):
        if symbols:
            print(f"{what}: {' '.join(symbols)}")
    if result.scores:
        print_scores(result.scores)
    return 0


# (flag, argparse name) of what makes a new run's config: a resumed run keeps its own, so each would be
# dropped without a word (issue 70: even an unknown preset was)
NEW_RUN_FLAGS = (("--preset", "preset"), ("--config", "config"), ("--recipe", "recipe"), ("--budget", "budget"),
                 ("--set", "overrides"), ("--data", "data"), ("--device", "device"), ("--epochs", "epochs"),
                 ("--time-budget", "time_budget"), ("--run-name", "run_name"))


def check_resume_flags(args) -> None:
    """--resume names a run (or is alone), without the flags it would drop: a UserError otherwise."""
    if not args.resume.strip():  # `--resume ''` (an unset variable) had started a new 300-epoch training
        raise UserError(f"--resume {args.resume!r}: give a run id (or its first 8 characters at least) or a "
                        "checkpoint file, or --resume alone for the latest unfinished run")
    given = [flag for flag, name in NEW_RUN_FLAGS if getattr(args, name) not in (None, [])]
    if given:
        raise UserError(f"--resume {args.resume} continues the run with the config it began with, so "
                        f"{', '.join(given)} would be dropped: leave {'it' if len(given) == 1 else 'them'} out "
                        "(or drop --resume to train a new run)")


def print_result(result) -> int:
    """The run's outcome in a few lines; the exit status (3 when paused)."""
    if result.stopped_by == "paused":
        print(f"paused run {result.run_id} after epoch {result.epochs}; continue with "
              f"hmer train --resume {result.run_id}")
        return EXIT_PAUSED
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    print(f"run {result.run_id}: {result.epochs} epochs (stopped by {result.stopped_by}), "
          f"best validation ExpRate {result.best_val_exprate:.2f} at epoch {result.best_epoch}")
    if result.test_scores:
        print_scores(result.test_scores)
    return 0


def find_resume_checkpoint(what: str, tracking_uri: str, experiment: str) -> Path:
    """The checkpoint of `what`: a checkpoint file, a run id (8 characters at least), or 'latest' (the
    newest unfinished run with one); a UserError or RunNotFoundError where there is none."""
    from mlflow.exceptions import MlflowException

    from ..checkpoint import load_checkpoint
    from ..tracking.models import run_by_prefix
    from ..tracking.store import checkpoint_root, mlflow_client, quiet_mlflow

    quiet_mlflow()
    client = mlflow_client(tracking_uri)
    path = Path(what)
    if path.is_file():  # its run must be in this store (else it had ended in an MlflowException after the data loaded)
        run_id = load_checkpoint(path, map_location="cpu").get("run_id")
        try:
            if run_id is not None:  # (a checkpoint of no run: a new run begins from it)
                client.get_run(run_id)
        except MlflowException:
            raise UserError(f"{path}: its run {run_id} is not in {client.tracking_uri}: resume it against the store "
                            f"it was trained in (--tracking-uri, HMER_MLRUNS)") from None
        return path
    root = checkpoint_root(tracking_uri)
    if what != "latest":
        run_id = run_by_prefix(client, what)
        ckpt = root / run_id / "last.pt"
        if not ckpt.is_file():
            raise UserError(f"no checkpoint for run {run_id} under {root}")
        return ckpt
    candidates = sorted(root.glob("*/last.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for ckpt in candidates:
        try:
            if client.get_run(ckpt.parent.name).info.status != "FINISHED":
                return ckpt
        except Exception:  # noqa: BLE001 - a checkpoint of another store
            continue
    raise UserError(f"no unfinished run with a checkpoint under {root}")

