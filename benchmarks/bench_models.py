"""Training and decoding throughput of every decoder family, on this machine.

    python benchmarks/bench_models.py                     # CPU: small sizes, a few minutes
    python benchmarks/bench_models.py --device cuda       # GPU: the paper-size presets, real sizes

Each figure comes from `hmer bench train|decode`, run in a fresh process per preset so
peak memory is that preset's own; the table printed at the end is what goes into
docs/benchmarks.md, together with this command, the date, the device and the commit.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys


def run(what: str, preset: str, device: str, images: int, extra: list[str]) -> dict[str, str]:
    cmd = [sys.executable, "-m", "hmer.cli", "bench", what, "--preset", preset, "--device", device,
           "--images", str(images), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    figures = {}
    for line in out.splitlines():
        for item in line.split():
            key, sep, value = item.partition("=")
            if sep:
                figures[key] = value
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--presets", default=None, help="comma-separated (default: by device)")
    p.add_argument("--train-images", type=int, default=0)
    p.add_argument("--decode-images", type=int, default=0)
    p.add_argument("--data", default=None)
    args = p.parse_args()
    gpu = args.device.startswith("cuda")
    presets = (args.presets or ("bttr,comer-fusion,wap-rnn,convs2s" if gpu else
                                "tiny,tiny-comer,tiny-rnn,tiny-convs2s")).split(",")
    train_images = args.train_images or (4096 if gpu else 48)
    decode_images = args.decode_images or (1000 if gpu else 8)
    extra = ["--data", args.data] if args.data else []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {datetime.date.today()} device={args.device} commit={commit}")
    print(f"# {' '.join(sys.argv)}")
    print("| preset | train img/s | train peak MB | epoch s (8,835 img) | padding | decode img/s (beam 10) | decode peak MB |")
    print("|---|---|---|---|---|---|---|")
    for preset in presets:
        tr = run("train", preset, args.device, train_images, extra)
        de = run("decode", preset, args.device, decode_images, extra)
        print(f"| {preset} | {float(tr['images_per_second']):.1f} | {tr['peak_memory_mb']} | "
              f"{tr['epoch_seconds_8835']} | {tr['padding_share']} | {float(de['images_per_second']):.2f} | "
              f"{de['peak_memory_mb']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
