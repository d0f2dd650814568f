"""`hmer evaluate`: a run or checkpoint scored on every test year (ExpRate, <=1, <=2); `hmer predict`: LaTeX
for image or InkML files, read by a run's or a checkpoint's model."""

from __future__ import annotations

import sys
from pathlib import Path

from . import options
from .options import EXIT_USAGE, UserError


def add_parser(sub) -> None:
    from ..config import SEARCH_RULES

    ev = sub.add_parser("evaluate", help="score a run or checkpoint on every test year")
    pr = sub.add_parser("predict", help="print LaTeX for images or InkML files (exit status 2 when a file is "
                        "refused: one with no ink is named on stderr and gets no prediction, the others do)")
    for p in (ev, pr):
        p.add_argument("model", metavar="RUN_OR_CHECKPOINT", help=options.RUN_OR_CHECKPOINT)
        p.add_argument("--device", default="auto", help=options.DEVICE)
        p.add_argument("--tracking-uri", default=None, help=options.TRACKING_URI)
    ev.add_argument("--data", default=None, help=options.DATA)
    ev.add_argument("--years", default="2014,2016,2019", help="the test years to score (default: 2014,2016,2019)")
    ev.add_argument("--beam", type=int, default=None, help="beam size (default: the run's, 10)")
    ev.add_argument("--limit", type=int, default=0, help="score only the first N of each year")
    ev.add_argument("--search-rule", choices=SEARCH_RULES, default=None,
                    help="beam search rule (default: the run's train.search_rule)")
    ev.add_argument("--standard-2014", nargs="?", const="", default=None, metavar="TAR",
                    help="also score the WAP authors' standard 2014 images as 2014-std, at the size the run's "
                         "images had (its data.render_height, else its data.render_scale) (default: "
                         "../shared/crohme/wap-offline-2014-test.tar.gz)")
    ev.add_argument("--log", action="store_true",
                    help="record the scores (test_<year>_*) and predictions in the run itself")
    ev.set_defaults(func=cmd_evaluate)
    pr.add_argument("files", nargs="+", metavar="FILE",
                    help="InkML, drawn as the run's training data was, or images (PNG, JPEG, BMP) of one formula "
                         "(a scan or photograph too: dark ink on evenly lit plain paper), made what the standard "
                         "2014 images are and scaled as the run's evaluation scales them, else refused saying why")
    pr.add_argument("--beam", type=int, default=None, help="beam width (default: the run's train.beam_size)")
    pr.set_defaults(func=cmd_predict)


def print_scores(scores) -> None:
    """The per-year table every command that scores prints: year, n, ExpRate, <=1, <=2."""
    print(f"{'year':<6} {'n':>5} {'ExpRate':>8} {'<=1':>7} {'<=2':>7}")
    for year, s in scores.items():
        print(f"{year:<6} {s.n:>5} {s.exprate:>8.2f} {s.le1:>7.2f} {s.le2:>7.2f}")


def cmd_evaluate(args) -> int:
    from ..config import check_value
    from ..data import load_dataset
    from ..device import autocast_dtype, resolve_device
    from ..evaluation.evaluate import decode_options, evaluate_split
    from ..tracking import load_model

    # the options that stand for config fields are checked before the model loads, as the fields are
    if args.beam is not None:
        check_value("train.beam_size", args.beam, "--beam")
    check_value("data.test_limit", args.limit, "--limit")
    device = resolve_device(args.device)
    model, cfg, vocab = load_model(args.model, args.tracking_uri, device)
    years = [y.strip() for y in args.years.split(",") if y.strip()]
    run_rule = cfg.train.search_rule
    cfg = cfg.override({"train.search_rule": args.search_rule or run_rule, "data.test_limit": args.limit})
    source = args.data or cfg.data.path or None
    data = load_dataset(source, cfg.data, splits=tuple(years))
    if args.standard_2014 is not None:
        from ..data.render import RenderConfig
        from ..data.standard import STANDARD_2014, default_standard_tar, standard_2014_expressions

        captions = {e.name: e.tokens for e in load_dataset(source, cfg.data, splits=("2014",))["2014"]}
        tar = args.standard_2014 or default_standard_tar()
        data[STANDARD_2014] = standard_2014_expressions(tar, captions, RenderConfig.from_data_config(cfg.data))
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
    print_scores(scores)
    if args.log:
        from ..tracking.models import log_evaluation

        log_evaluation(args.model, results, args.tracking_uri)
        print(f"recorded in run {args.model}: " + ", ".join(f"test_{y}_*" for y in results))
    return 0


def cmd_predict(args) -> int:
    from ..config import check_value
    from ..data import RenderConfig
    from ..data.errors import NoInkError
    from ..data.images import check_expression_file, read_expression_file
    from ..device import autocast_dtype, resolve_device
    from ..evaluation.evaluate import decode_options, predict
    from ..tracking import load_model

    if args.beam is not None:
        check_value("train.beam_size", args.beam, "--beam")
    for f in args.files:  # a missing file or a wrong suffix fails before the model is loaded
        check_expression_file(f)
    device = resolve_device(args.device)
    model, cfg, vocab = load_model(args.model, args.tracking_uri, device)
    # each file read once, InkML rendered as the training data was; a corrupt file fails here, named
    render_cfg = RenderConfig.from_data_config(cfg.data)
    exprs, blank = [], 0
    for f in args.files:
        try:
            exprs.append(read_expression_file(f, render_cfg))
        except NoInkError as exc:  # named, and the other files are still read
            print(f"hmer: error: {exc}", file=sys.stderr)
            blank += 1
    if exprs:
        preds, _ = predict(model, exprs, vocab,
                           **decode_options(cfg, device, autocast_dtype(cfg.train.precision, device),
                                            beam=args.beam or None, progress="decoding" if len(exprs) > 1 else None))
        for expr, tokens in zip(exprs, preds):
            latex = " ".join(tokens)
            print(f"{expr.name}\t{latex}" if len(args.files) > 1 else latex)
    return EXIT_USAGE if blank else 0
