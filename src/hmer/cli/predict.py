"""`hmer predict`: LaTeX for image or InkML files, read by a run's or a checkpoint's model."""

from __future__ import annotations

import sys

from . import options
from .options import EXIT_USAGE


def add_parser(sub) -> None:
    pr = sub.add_parser("predict", help="print LaTeX for images or InkML files (exit status 2 when a file is "
                        "refused: one with no ink is named on stderr and gets no prediction, the others do)")
    pr.add_argument("model", metavar="RUN_OR_CHECKPOINT", help=options.RUN_OR_CHECKPOINT)
    pr.add_argument("files", nargs="+", metavar="FILE",
                    help="InkML, drawn as the run's training data was, or images (PNG, JPEG, BMP) of one formula "
                         "(a scan or photograph too: dark ink on evenly lit plain paper), made what the standard "
                         "2014 images are and scaled as the run's evaluation scales them, else refused saying why")
    pr.add_argument("--beam", type=int, default=None, help="beam width (default: the run's train.beam_size)")
    pr.add_argument("--device", default="auto", help=options.DEVICE)
    pr.add_argument("--tracking-uri", default=None, help=options.TRACKING_URI)
    pr.set_defaults(func=cmd_predict)


def cmd_predict(args) -> int:
    from ..data import RenderConfig
    from ..data.errors import NoInkError
    from ..data.files import check_expression_file, read_expression_file
    from ..evaluation.evaluate import decode_options, predict
    from ..tracking import load_model
    from ..device import autocast_dtype, resolve_device

    from ..config import check_value

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
