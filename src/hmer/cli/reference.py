"""`hmer import`: a published BTTR or CoMER Lightning checkpoint, read safely and recorded as a run."""

from __future__ import annotations

from . import options
from .evaluate import print_scores


def add_parser(sub) -> None:
    im = sub.add_parser("import", help="record a BTTR or CoMER Lightning checkpoint as a run (read safely)")
    im.add_argument("checkpoint", metavar="CHECKPOINT", help="a BTTR or CoMER Lightning checkpoint (.ckpt)")
    im.add_argument("--dictionary", default=None, help="its dictionary.txt (default: the family's own)")
    im.add_argument("--register", default="", metavar="NAME", help="registered model (default: <preset>-reference)")
    im.add_argument("--years", default="", help="test years to score now, e.g. 2014,2016,2019 (default: none)")
    im.add_argument("--data", default=None, help=options.DATA)
    im.add_argument("--limit", type=int, default=0, help="score only the first N of each year")
    im.add_argument("--device", default="auto", help=options.DEVICE)
    im.add_argument("--experiment", default="hmer", help="MLflow experiment (default: hmer)")
    im.add_argument("--run-name", default=None, help="the MLflow run's name (default: the checkpoint's file name)")
    im.add_argument("--tracking-uri", default=None, help=options.TRACKING_URI)
    im.set_defaults(func=cmd_import)


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
