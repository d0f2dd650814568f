"""Training and decoding throughput of every decoder family, on this machine.

    python benchmarks/bench_models.py                          # CPU: tiny presets, small sizes
    python benchmarks/bench_models.py --data ../shared/crohme/crohme-inkml.zip   # real CROHME batches
    python benchmarks/bench_models.py --device cuda --data <zip>                 # GPU: paper-size presets
    python benchmarks/bench_models.py --presets bttr --what train --train-images 4   # one preset, training only

Each figure comes from `hmer bench train|decode`, run in a fresh process per preset and
benchmark so that peak memory is that run's own; runs go one at a time. The table printed
at the end is what goes into docs/benchmarks.md, with the date, the device, the commit and
the exact command behind every figure (printed under the table).

Columns: training images/s (wall clock) and images per CPU-second (the process's CPU time,
steadier than wall time when other jobs share the cores), peak memory (GPU: allocated by
torch; CPU: the process's peak resident set, the data included), the time an epoch of
CROHME train (8,835 images) would take at that rate, the padding share of the batches, and
the same for beam-search decoding plus the mean hypothesis length: with untrained weights
hypotheses seldom end before max_len, so compare that column with CROHME's ~11 tokens
before reading a decode figure (`--decode-set bench.weights=RUN_OR_CHECKPOINT` decodes with
trained weights).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures_of(output: str) -> dict[str, str]:
    figures = {}
    for line in output.splitlines():
        for item in line.split():
            key, sep, value = item.partition("=")
            if sep:
                figures[key] = value
    return figures


def run(what: str, preset: str, device: str, images: int, extra: list[str]) -> tuple[dict[str, str], str, float]:
    """(figures, the command as typed, wall seconds of the whole process)."""
    args = ["bench", what, "--preset", preset, "--device", device, "--images", str(images), *extra]
    cmd = [sys.executable, "-m", "hmer.cli", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    took = time.perf_counter() - start
    shown = "hmer " + shlex.join(args)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return {"error": tail[0]}, shown, took
    return figures_of(proc.stdout), shown, took


def cell(figures: dict[str, str], key: str, fmt: str = "{}") -> str:
    if "error" in figures:
        return "error"
    value = figures.get(key)
    if value is None:
        return "–"
    try:
        return fmt.format(float(value))
    except ValueError:
        return value


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--presets", default=None, help="comma-separated (default: by device)")
    p.add_argument("--what", default="train,decode", help="train, decode or both (default)")
    p.add_argument("--train-images", type=int, default=0, help="default: 48 on CPU, 4096 on GPU")
    p.add_argument("--decode-images", type=int, default=0, help="default: 4 on CPU, 1000 on GPU")
    p.add_argument("--data", default=None, help="real CROHME batches (train split / 2014) instead of synthetic")
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config or bench.* settings for every run")
    p.add_argument("--train-set", nargs="*", default=[], metavar="KEY=VALUE", help="for the training runs only")
    p.add_argument("--decode-set", nargs="*", default=[], metavar="KEY=VALUE", help="for the decoding runs only")
    args = p.parse_args()
    gpu = args.device.startswith("cuda")
    presets = (args.presets or ("bttr,comer-fusion,wap-rnn,convs2s" if gpu else
                                "tiny-transformer,tiny-comer,tiny-rnn,tiny-convs2s")).split(",")
    whats = [w.strip() for w in args.what.split(",") if w.strip()]
    train_images = args.train_images or (4096 if gpu else 48)
    decode_images = args.decode_images or (1000 if gpu else 4)
    # On CPU a decode batch is capped at 4 images (the evaluation default is 64): an untrained model's
    # hypotheses run to max_len, and one 64-image batch of them takes many minutes on two cores.
    decode_cpu = [] if gpu else ["data.eval_max_batch_size=4"]
    base = ["--data", args.data] if args.data else []

    def sets(items: list[str]) -> list[str]:
        return ["--set", *items] if items else []

    from hmer.tracking.store import git_commit

    commit = git_commit(short=True, root=ROOT)  # "-dirty" when tracked files have uncommitted changes
    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M} device={args.device} commit={commit} "
          f"python={platform.python_version()}")
    print(f"# {shlex.join(['python', 'benchmarks/bench_models.py', *sys.argv[1:]])}")
    commands: list[str] = []
    rows: list[str] = []
    header = ("| preset | params | train img/s | train img/CPU-s | train peak MB | epoch s (8,835 img) | padding "
              "| decode img/s | decode img/CPU-s | mean hyp tokens | decode peak MB | decode padding |")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for preset in presets:
        tr = de = {}
        if "train" in whats:
            tr, cmd, took = run("train", preset, args.device, train_images,
                                base + sets(args.overrides + args.train_set))
            commands.append(f"{cmd}   # {took:.0f} s")
        if "decode" in whats:
            de, cmd, took = run("decode", preset, args.device, decode_images,
                                base + sets(args.overrides + decode_cpu + args.decode_set))
            commands.append(f"{cmd}   # {took:.0f} s")
        params = (tr or de).get("params", "?")
        params = f"{int(params) / 1e6:.2f}M" if params.isdigit() else params
        row = (f"| {preset} | {params} | {cell(tr, 'images_per_second', '{:.3g}')} | "
               f"{cell(tr, 'images_per_cpu_second', '{:.3g}')} | {cell(tr, 'peak_memory_mb', '{:.0f}')} | "
               f"{cell(tr, 'epoch_seconds_8835', '{:,.0f}')} | {cell(tr, 'padding_share', '{:.1%}')} | "
               f"{cell(de, 'images_per_second', '{:.3g}')} | {cell(de, 'images_per_cpu_second', '{:.3g}')} | "
               f"{cell(de, 'mean_hyp_tokens', '{:.0f}')} | {cell(de, 'peak_memory_mb', '{:.0f}')} | "
               f"{cell(de, 'padding_share', '{:.1%}')} |")
        rows.append(row)
        print(row, flush=True)
        for name, f in (("train", tr), ("decode", de)):
            if "error" in f:
                print(f"#   {preset} {name} failed: {f['error']}", flush=True)
    print("\nCommands (one process each, run one after another; wall time of the whole process):")
    for c in commands:
        print(f"    {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
