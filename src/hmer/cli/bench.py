"""`hmer bench train | decode`: training or decoding throughput, ending with images_per_second=N;
`hmer bench peak`: the matmul ceiling those figures are read against."""

from __future__ import annotations

from . import options


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="throughput benchmarks; the last line is images_per_second=N")
    bsub = bench.add_subparsers(title="benchmarks", metavar="WHAT")
    for what in ("train", "decode"):
        b = bsub.add_parser(what, help=f"{what} throughput")
        b.add_argument("--preset", default=None, help="the model and recipe (default: bttr)")
        b.add_argument("--config", default=None,
                       help="a JSON config file in place of --preset (a run's config.json: time what it trained)")
        b.add_argument("--device", default="auto", help=options.DEVICE)
        b.add_argument("--data", default=None, help="real CROHME batches (default: synthetic images)")
        b.add_argument("--images", type=int, default=0, help="images to process (default: by device)")
        b.add_argument("--seconds", type=float, default=0.0, help="time limit")
        b.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE", help=options.SET)
        b.set_defaults(func=cmd_bench, what=what)
    peak = bsub.add_parser("peak", help="the float32 matmul GFLOP/s of this process's threads (the share-of-peak "
                                        "denominator of train and decode)")
    peak.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    peak.add_argument("--size", type=int, default=2048, help="the matmul's size, N x N (default: 2048)")
    peak.set_defaults(func=cmd_peak)


def cmd_bench(args) -> int:
    from ..bench import run_benchmark
    from .options import UserError

    if args.config and args.preset:
        raise UserError("give --preset or --config, not both")
    return run_benchmark(args.what, preset=args.preset or "bttr", device=args.device, data=args.data,
                         images=args.images, seconds=args.seconds, overrides=args.overrides, config=args.config)


def cmd_peak(args) -> int:
    from ..bench.timing import run_peak

    return run_peak(threads=args.threads, size=args.size)
