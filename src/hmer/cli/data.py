"""`hmer data check | split | render`: a CROHME dataset checked, its validation hold-out shown, or rendered."""

from __future__ import annotations

from . import options
from .options import UserError


def add_parser(sub) -> None:
    data = sub.add_parser("data", help="check or render a CROHME dataset")
    dsub = data.add_subparsers(title="data commands", metavar="COMMAND")
    check = dsub.add_parser("check", help="count every split and list every problem")
    split = dsub.add_parser("split", help="the validation hold-out a run would use: sizes, writers, lengths")
    render = dsub.add_parser("render", help="render InkML into the BTTR/CoMER data.zip layout")
    for command, func in ((check, cmd_data_check), (split, cmd_data_split), (render, cmd_data_render)):
        command.add_argument("data", nargs="?", help=options.DATA)
        command.set_defaults(func=func)
    split.add_argument("--preset", default=None, help="a preset from `hmer models` (default: bttr)")
    split.add_argument("--config", default=None, help="a config.json")
    split.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE",
                       help="config overrides, e.g. data.val_split=random data.val_seed=3")
    split.add_argument("--out", default=None, metavar="DIR", help="write DIR/train.txt and DIR/val.txt")
    render.add_argument("--out", required=True, help="the zip to write")
    render.add_argument("--workers", type=int, default=None, help="render processes (default: all cores)")
    render.add_argument("--limit", type=int, default=0, help="only the first N expressions of each split")
    render.add_argument("--format", choices=("bmp", "png"), default="bmp",
                        help="8-bit grey BMP, as BTTR's and CoMER's data.zip (default), or 1-bit PNG (smaller)")


def cmd_data_check(args) -> int:
    from ..data.commands import check_command

    return check_command(args.data)


def cmd_data_split(args) -> int:
    from ..config import Config, parse_overrides
    from ..data.commands import split_command
    from ..model_presets import preset_with_recipe

    if args.config and args.preset:
        raise UserError("give --preset or --config, not both")
    cfg = Config.load(args.config) if args.config else preset_with_recipe(args.preset or "bttr")
    cfg = cfg.override(parse_overrides(args.overrides)).validate()
    return split_command(args.data, cfg.data, args.out)


def cmd_data_render(args) -> int:
    from ..data.commands import render_command

    return render_command(args.data, args.out, workers=args.workers, limit=args.limit, image_format=args.format)
