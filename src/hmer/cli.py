"""The `hmer` command: a thin front end over the library.

    hmer data check [DATA]              counts per split and every problem found
    hmer data render [DATA] --out Z     the BTTR/CoMER data.zip layout, rendered
    hmer models                         the model presets and their parameter counts
    hmer train --preset bttr            train, tracked in MLflow (resume with --resume)
    hmer evaluate RUN_OR_CHECKPOINT     per-year ExpRate table
    hmer predict RUN_OR_CHECKPOINT F..  LaTeX for images or InkML files
    hmer import CHECKPOINT              a published BTTR / CoMER checkpoint as a run
    hmer report [--study NAME]          tables (Markdown, CSV) and plots (PNG); --list: every study
    hmer analyze RUN [RUN_B]            errors by length and structure, token edits, A vs B
    hmer bench train|decode             throughput benchmarks

Bad input (a missing file, an unknown run id, a corrupt InkML, a token outside the
vocabulary) ends with a one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_USAGE = 2


class UserError(Exception):
    """An error in what the user asked for; printed as one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        if hasattr(args, "tracking_uri"):  # a command that talks to MLflow: is its server up?
            from .tracking.store import check_tracking_server

            check_tracking_server(args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""))
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("hmer: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - sorted into user errors and bugs below
        if _is_user_error(exc):
            print(f"hmer: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        raise


def _is_user_error(exc: BaseException) -> bool:
    from .tracking.models import RunNotFoundError

    user_types: tuple[type[BaseException], ...] = (UserError, RunNotFoundError, FileNotFoundError,
                                                   IsADirectoryError, PermissionError, KeyError, ValueError)
    return isinstance(exc, user_types)


def build_parser() -> argparse.ArgumentParser:
    from .config import SEARCH_RULES

    p = argparse.ArgumentParser(prog="hmer", description="Handwritten mathematical expression recognition: "
                                "an ablation suite (BTTR, CoMER, WAP, ConvS2S) with MLflow and Optuna.")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    # data
    data = sub.add_parser("data", help="check or render a CROHME dataset")
    dsub = data.add_subparsers(title="data commands", metavar="COMMAND")
    check = dsub.add_parser("check", help="count every split and list every problem")
    check.add_argument("data", nargs="?", help="folder or zip (default: $HMER_DATA, then data/crohme)")
    check.set_defaults(func=cmd_data_check)
    split = dsub.add_parser("split", help="the validation hold-out a run would use: sizes, writers, lengths")
    split.add_argument("data", nargs="?", help="folder or zip (default: $HMER_DATA, then data/crohme)")
    split.add_argument("--preset", default=None, help="a preset from `hmer models` (default: bttr)")
    split.add_argument("--config", default=None, help="a config.json")
    split.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE",
                       help="config overrides, e.g. data.val_split=random data.val_seed=3")
    split.add_argument("--out", default=None, metavar="DIR", help="write DIR/train.txt and DIR/val.txt")
    split.set_defaults(func=cmd_data_split)
    render = dsub.add_parser("render", help="render InkML into the BTTR/CoMER data.zip layout")
    render.add_argument("data", nargs="?", help="folder or zip (default: $HMER_DATA, then data/crohme)")
    render.add_argument("--out", required=True, help="the zip to write")
    render.add_argument("--workers", type=int, default=None, help="render processes (default: all cores)")
    render.add_argument("--limit", type=int, default=0, help="only the first N expressions of each split")
    render.set_defaults(func=cmd_data_render)

    # models
    models = sub.add_parser("models", help="list the model presets with their parameter counts")
    models.set_defaults(func=cmd_models)

    # train
    tr = sub.add_parser("train", help="train a preset or config file, tracked in MLflow")
    tr.add_argument("--preset", default=None, help="a preset from `hmer models` (default: bttr)")
    tr.add_argument("--config", default=None, help="a JSON config file (as logged in a run's config.json)")
    tr.add_argument("--recipe", choices=("bttr", "comer"), default=None, help="optimiser recipe")
    tr.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides such as train.lr=0.5 model.direction=l2r")
    tr.add_argument("--data", default=None, help="dataset folder or zip")
    tr.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N")
    tr.add_argument("--epochs", type=int, default=None)
    tr.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="wall-clock budget for training; then it checkpoints and evaluates")
    tr.add_argument("--experiment", default="hmer", help="MLflow experiment (default: hmer)")
    tr.add_argument("--run-name", default=None)
    tr.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, then mlruns/")
    tr.add_argument("--resume", nargs="?", const="latest", default=None, metavar="RUN_OR_CHECKPOINT",
                    help="continue a killed run: a run id, a checkpoint, or the latest unfinished run")
    tr.add_argument("--no-progress", action="store_true")
    tr.add_argument("--pause-after-epochs", type=int, default=0, metavar="N",
                    help="train N epochs, checkpoint and exit with status 3 (continue with --resume)")
    tr.set_defaults(func=cmd_train)

    # evaluate
    ev = sub.add_parser("evaluate", help="score a run or checkpoint on every test year")
    ev.add_argument("model", metavar="RUN_OR_CHECKPOINT")
    ev.add_argument("--data", default=None)
    ev.add_argument("--years", default="2014,2016,2019")
    ev.add_argument("--beam", type=int, default=None, help="beam size (default: the run's, 10)")
    ev.add_argument("--limit", type=int, default=0, help="score only the first N of each year")
    ev.add_argument("--search-rule", choices=SEARCH_RULES, default=None,
                    help="beam search rule (default: the run's train.search_rule)")
    ev.add_argument("--standard-2014", nargs="?", const="", default=None, metavar="TAR",
                    help="also score the WAP authors' standard 2014 images (default: ../shared/crohme/"
                         "wap-offline-2014-test.tar.gz), scaled to the run's rendering height, as 2014-std")
    ev.add_argument("--log", action="store_true",
                    help="record the scores (test_<year>_*) and predictions in the run itself")
    ev.add_argument("--device", default="auto")
    ev.add_argument("--tracking-uri", default=None)
    ev.set_defaults(func=cmd_evaluate)

    # predict
    pr = sub.add_parser("predict", help="print LaTeX for images or InkML files")
    pr.add_argument("model", metavar="RUN_OR_CHECKPOINT")
    pr.add_argument("files", nargs="+", metavar="FILE")
    pr.add_argument("--beam", type=int, default=None)
    pr.add_argument("--device", default="auto")
    pr.add_argument("--tracking-uri", default=None)
    pr.set_defaults(func=cmd_predict)

    # import
    im = sub.add_parser("import", help="record a BTTR or CoMER Lightning checkpoint as a run (read safely)")
    im.add_argument("checkpoint", metavar="CHECKPOINT")
    im.add_argument("--dictionary", default=None, help="its dictionary.txt (default: the family's own)")
    im.add_argument("--register", default="", metavar="NAME", help="registered model (default: <preset>-reference)")
    im.add_argument("--years", default="", help="test years to score now, e.g. 2014,2016,2019 (default: none)")
    im.add_argument("--data", default=None)
    im.add_argument("--limit", type=int, default=0, help="score only the first N of each year")
    im.add_argument("--device", default="auto")
    im.add_argument("--experiment", default="hmer")
    im.add_argument("--run-name", default=None)
    im.add_argument("--tracking-uri", default=None)
    im.set_defaults(func=cmd_import)

    # report
    rp = sub.add_parser("report", help="per-year ExpRate tables (Markdown, CSV) and plots (PNG)")
    rp.add_argument("--study", default=None, help="an Optuna study / MLflow study name")
    rp.add_argument("--experiment", default=None, help="an MLflow experiment name")
    rp.add_argument("--runs", nargs="*", default=None, metavar="RUN_ID")
    rp.add_argument("--list", action="store_true", help="list the studies in the store with their state and trials")
    rp.add_argument("--tracking-uri", default=None)
    rp.add_argument("--out", default=None, help="output folder (default: reports/<name>)")
    rp.add_argument("--analysis", action="store_true",
                    help="also the error analysis per variant (as hmer analyze) into OUT/analysis/")
    rp.add_argument("--published", action="store_true", help="print the papers' published ExpRates alone")
    rp.set_defaults(func=cmd_report)

    # runs: move MLflow runs between stores (a GPU machine's and mlruns/)
    runs = sub.add_parser("runs", help="export MLflow runs to one file, or merge such a file into the store")
    rsub = runs.add_subparsers(title="runs commands", metavar="COMMAND")
    ex = rsub.add_parser("export", help="write runs (params, metric histories, tags, artifacts) to a .tar.gz")
    ex.add_argument("file", metavar="FILE")
    ex.add_argument("--experiment", action="append", default=None, help="only this experiment (repeatable)")
    ex.add_argument("--runs", nargs="*", default=None, metavar="RUN_ID", help="only these runs")
    ex.add_argument("--max-artifact-mb", type=float, default=0.0, help="leave out larger artifact files")
    ex.add_argument("--part-mb", type=float, default=0.0, help="split into FILE.part-NNN of at most N MiB")
    ex.add_argument("--tracking-uri", default=None)
    ex.set_defaults(func=cmd_runs_export)
    im = rsub.add_parser("import", help="merge an export into the store (idempotent; keeps the source run id "
                         "as tag hmer.source_run_id)")
    im.add_argument("files", nargs="+", metavar="FILE", help="an export, or any of its FILE.part-NNN")
    im.add_argument("--tracking-uri", default=None)
    im.set_defaults(func=cmd_runs_import)
    pub = rsub.add_parser("publish", help="copy a finished local store (FOLDER/mlflow.db, optuna.db, artifacts/) "
                          "into mlruns/, made portable so that it can be committed")
    pub.add_argument("folder", metavar="FOLDER")
    pub.set_defaults(func=cmd_runs_publish)
    ws = rsub.add_parser("workspace", help="copy the committed store in mlruns/ to FOLDER to run more studies "
                         "there (then `hmer runs publish FOLDER`)")
    ws.add_argument("folder", metavar="FOLDER")
    ws.set_defaults(func=cmd_runs_workspace)

    # analyze
    an = sub.add_parser("analyze", help="error analysis of a run's predictions, or two runs compared")
    an.add_argument("runs", nargs="+", metavar="RUN_ID", help="one run, or two to compare (A then B)")
    an.add_argument("--format", dest="fmt", choices=("markdown", "csv"), default="markdown")
    an.add_argument("--out", default=None, help="also write the tables (Markdown, CSV) and a plot here")
    an.add_argument("--top", type=int, default=10, help="token edits listed per kind (default 10)")
    an.add_argument("--tracking-uri", default=None)
    an.set_defaults(func=cmd_analyze)

    # bench
    bench = sub.add_parser("bench", help="throughput benchmarks; the last line is images_per_second=N")
    bsub = bench.add_subparsers(title="benchmarks", metavar="WHAT")
    for what in ("train", "decode"):
        b = bsub.add_parser(what, help=f"{what} throughput")
        b.add_argument("--preset", default="bttr")
        b.add_argument("--device", default="auto")
        b.add_argument("--data", default=None, help="real CROHME batches (default: synthetic images)")
        b.add_argument("--images", type=int, default=0, help="images to process (default: by device)")
        b.add_argument("--seconds", type=float, default=0.0, help="time limit")
        b.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE")
        b.set_defaults(func=cmd_bench, what=what)
    return p


# ---- data ------------------------------------------------------------------------------------

def cmd_data_check(args) -> int:
    from .data.commands import check_command

    return check_command(args.data)


def cmd_data_split(args) -> int:
    from .config import Config, parse_overrides
    from .data.commands import split_command
    from .presets import experiment_config

    if args.config and args.preset:
        raise UserError("give --preset or --config, not both")
    cfg = Config.load(args.config) if args.config else experiment_config(args.preset or "bttr")
    cfg = cfg.override(parse_overrides(args.overrides)).validate()
    return split_command(args.data, cfg.data, args.out)


def cmd_data_render(args) -> int:
    from .data.commands import render_command

    return render_command(args.data, args.out, workers=args.workers, limit=args.limit)


# ---- models ----------------------------------------------------------------------------------

def cmd_models(args) -> int:
    from .model import models_table

    print(models_table())
    return 0


# ---- train -----------------------------------------------------------------------------------

def cmd_train(args) -> int:
    from .config import Config, parse_overrides
    from .presets import experiment_config
    from .training import apply_recipe, train

    if args.resume:
        ckpt = _find_resume_checkpoint(args.resume, args.tracking_uri, args.experiment)
        print(f"resuming from {ckpt}", file=sys.stderr)
        result = train(Config(), tracking_uri=args.tracking_uri, experiment=args.experiment, resume=ckpt,
                       progress=not args.no_progress, pause_after_epochs=args.pause_after_epochs)
        return _print_result(result)
    if args.config and args.preset:
        raise UserError("give --preset or --config, not both")
    if args.config:
        cfg = Config.load(args.config)
    else:
        cfg = experiment_config(args.preset or "bttr")
    if args.recipe:
        cfg = apply_recipe(cfg, args.recipe)
    overrides = parse_overrides(args.overrides)
    if args.data:
        overrides["data.path"] = args.data
    if args.device:
        overrides["train.device"] = args.device
    if args.epochs is not None:
        overrides["train.epochs"] = str(args.epochs)
    if args.budget is not None:
        overrides["train.time_budget_s"] = str(args.budget)
    cfg = cfg.override(overrides).validate()
    result = train(cfg, tracking_uri=args.tracking_uri, experiment=args.experiment, run_name=args.run_name,
                   progress=not args.no_progress, pause_after_epochs=args.pause_after_epochs)
    return _print_result(result)


EXIT_PAUSED = 3  # `hmer train --pause-after-epochs`: checkpointed, to be continued with --resume


def _print_result(result) -> int:
    if result.stopped_by == "paused":
        print(f"paused run {result.run_id} after epoch {result.epochs}; continue with "
              f"hmer train --resume {result.run_id}")
        return EXIT_PAUSED
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    print(f"run {result.run_id}: {result.epochs} epochs (stopped by {result.stopped_by}), "
          f"best validation ExpRate {result.best_val_exprate:.2f} at epoch {result.best_epoch}")
    if result.test_scores:
        _print_scores(result.test_scores)
    return 0


def _print_scores(scores) -> None:
    print(f"{'year':<6} {'n':>5} {'ExpRate':>8} {'<=1':>7} {'<=2':>7}")
    for year, s in scores.items():
        print(f"{year:<6} {s.n:>5} {s.exprate:>8.2f} {s.le1:>7.2f} {s.le2:>7.2f}")


def _find_resume_checkpoint(what: str, tracking_uri: str | None, experiment: str) -> Path:
    """A checkpoint file, a run id, or 'latest': the newest unfinished run with a checkpoint."""
    from .tracking.store import default_checkpoint_root

    path = Path(what)
    if path.is_file():
        return path
    root = default_checkpoint_root()
    if what != "latest":
        ckpt = root / what / "last.pt"
        if not ckpt.is_file():
            raise UserError(f"no checkpoint for run {what} under {root}")
        return ckpt
    candidates = sorted(root.glob("*/last.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
    from mlflow.tracking import MlflowClient

    from .tracking.store import default_tracking_uri, quiet_mlflow

    quiet_mlflow()

    client = MlflowClient(tracking_uri=tracking_uri or default_tracking_uri())
    for ckpt in candidates:
        try:
            if client.get_run(ckpt.parent.name).info.status != "FINISHED":
                return ckpt
        except Exception:  # noqa: BLE001 - a checkpoint of another store
            continue
    raise UserError(f"no unfinished run with a checkpoint under {root}")


# ---- evaluate / predict ------------------------------------------------------------------------

def cmd_evaluate(args) -> int:
    from .data import load_dataset
    from .evaluation.evaluate import decode_options, evaluate_split
    from .tracking import load_model
    from .device import autocast_dtype, resolve_device

    device = resolve_device(args.device)
    model, cfg, vocab = load_model(args.model, args.tracking_uri, device)
    years = [y.strip() for y in args.years.split(",") if y.strip()]
    run_rule = cfg.train.search_rule
    cfg.train.search_rule = args.search_rule or cfg.train.search_rule
    data_cfg = cfg.data
    data_cfg.test_limit = args.limit
    data = load_dataset(args.data or cfg.data.path or None, data_cfg, splits=tuple(years))
    if args.standard_2014 is not None:
        from .data.standard import STANDARD_2014, default_standard_tar, standard_2014_expressions

        captions = {e.name: e.tokens for e in load_dataset(args.data or cfg.data.path or None, data_cfg,
                                                            splits=("2014",))["2014"]}
        tar = args.standard_2014 or default_standard_tar()
        data[STANDARD_2014] = standard_2014_expressions(tar, captions, cfg.data.render_height)
        years.append(STANDARD_2014)
    if args.log and Path(args.model).is_file():
        raise UserError("--log records into a run: give a run id, not a checkpoint file")
    if args.log and (args.beam or (args.search_rule and args.search_rule != run_rule)):
        # the run's test_<year>_* are its scores under its own decoding (a --limit shows in test_<year>_n)
        raise UserError("--log records only the run's own decoding: drop --beam and --search-rule")
    scores, results = {}, {}
    for year in years:
        res = evaluate_split(model, data[year], vocab,
                             **decode_options(cfg, device, autocast_dtype(cfg.train.precision, device),
                                              beam=args.beam or None, progress=f"decoding {year}"))
        scores[year], results[year] = res.scores, res
        if res.resized:
            print(f"{year}: {res.resized} oversize images were resized to fit "
                  f"{cfg.data.max_image_pixels} px (none dropped)", file=sys.stderr)
    _print_scores(scores)
    if args.log:
        from .tracking.models import log_evaluation

        log_evaluation(args.model, results, args.tracking_uri)
        print(f"recorded in run {args.model}: " + ", ".join(f"test_{y}_*" for y in results))
    return 0


def cmd_predict(args) -> int:
    from .data import RenderConfig
    from .data.files import check_expression_file, read_expression_file
    from .evaluation.evaluate import decode_options, predict
    from .tracking import load_model
    from .device import autocast_dtype, resolve_device

    for f in args.files:  # a missing file or a wrong suffix fails before the model is loaded
        check_expression_file(f)
    device = resolve_device(args.device)
    model, cfg, vocab = load_model(args.model, args.tracking_uri, device)
    # Each file is read once, and rendered (InkML) as the model's training data was; a corrupt
    # file fails here, naming itself.
    render_cfg = RenderConfig.from_data_config(cfg.data)
    exprs = [read_expression_file(f, render_cfg) for f in args.files]
    preds, _ = predict(model, exprs, vocab,
                       **decode_options(cfg, device, autocast_dtype(cfg.train.precision, device),
                                        beam=args.beam or None, progress="decoding" if len(exprs) > 1 else None))
    for expr, tokens in zip(exprs, preds):
        latex = " ".join(tokens)
        print(f"{expr.name}\t{latex}" if len(exprs) > 1 else latex)
    return 0


def cmd_import(args) -> int:
    from .tracking.import_reference import import_reference

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
        _print_scores(result.scores)
    return 0


# ---- report / bench ----------------------------------------------------------------------------

def cmd_report(args) -> int:
    from .reports.cli import latest_study, list_command, report_command

    if args.published:
        from .reports.published import format_published

        if args.study or args.experiment or args.runs or args.analysis:
            raise UserError("--published prints the published figures alone; drop --study/--experiment/--runs")
        print(format_published("text"), end="")
        return 0
    if args.list:
        return list_command(args.tracking_uri)
    if not (args.study or args.experiment or args.runs):  # as `optuna`/`mlflow` do: a useful default
        args.study = latest_study(args.tracking_uri)
        print(f"hmer report: the latest study, {args.study} (hmer report --list shows them all)", flush=True)
    return report_command(study=args.study, experiment=args.experiment, run_ids=args.runs,
                          tracking_uri=args.tracking_uri, out_dir=args.out, analysis=args.analysis)


def cmd_analyze(args) -> int:
    from .reports.analysis import analyze_command

    if len(args.runs) > 2:
        raise UserError(f"give one run to analyse or two to compare, not {len(args.runs)}")
    return analyze_command(args.runs, tracking_uri=args.tracking_uri, fmt=args.fmt, out_dir=args.out, top=args.top)


def cmd_runs_export(args) -> int:
    from .tracking.transfer import export_runs

    res = export_runs(args.file, tracking_uri=args.tracking_uri, experiments=args.experiment, run_ids=args.runs,
                      max_artifact_mb=args.max_artifact_mb, part_mb=args.part_mb)
    print(f"exported {res.runs} runs to " + ", ".join(str(f) for f in res.files))
    for item in res.omitted_artifacts:
        print(f"  left out {item}", file=sys.stderr)
    return 0


def cmd_runs_publish(args) -> int:
    from .tracking.portable import copy_store
    from .tracking.store import mlruns_dir

    db = copy_store(args.folder, mlruns_dir(), portable=True)
    print(f"published {args.folder} to {db.parent} (artifact locations relative to the checkout)")
    return 0


def cmd_runs_workspace(args) -> int:
    from .tracking.portable import copy_store
    from .tracking.store import mlruns_dir

    db = copy_store(mlruns_dir(), args.folder, portable=False)
    print(f"copied {mlruns_dir()} to {db.parent}; run studies with HMER_MLRUNS={db.parent}, "
          f"then `hmer runs publish {db.parent}`")
    return 0


def cmd_runs_import(args) -> int:
    from .tracking.transfer import import_runs

    for f in args.files:
        res = import_runs(f, tracking_uri=args.tracking_uri)
        print(f"{f}: {len(res.created)} runs created, {len(res.updated)} already there (brought up to date)")
        for src, rid in res.id_map.items():
            print(f"  {src} -> {rid}")
    return 0


def cmd_bench(args) -> int:
    from .bench import run_benchmark

    return run_benchmark(args.what, preset=args.preset, device=args.device, data=args.data,
                         images=args.images, seconds=args.seconds, overrides=args.overrides)


if __name__ == "__main__":
    sys.exit(main())
