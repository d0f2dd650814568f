"""What the renderer augmentation (`data.aug_*`, hmer.data.augment) costs per training epoch: every
training expression (8,251 after the hold-out) redrawn once from its strokes at the CPU protocol's
64 px, in one thread, for several settings, beside the collation that an epoch does anyway.

    python benchmarks/bench_augment.py [DATA] [--height 64] [--limit N]

Prints wall and CPU seconds per epoch with `data.aug_share=1` (every image redrawn; a share s costs
s times as much). The CPU seconds are the figure to compare with an epoch's ~150-170 s on a loaded
machine, where wall seconds also count the time other processes held the core. Run it pinned to
one core (`taskset -c 1`), as training on a CPU is.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

SETTINGS = {
    "pen width 0.5-1.5x only": dict(width_min=0.5, width_max=1.5),
    "pressure 0.3": dict(pressure=0.3),
    "antialias always": dict(antialias=1.0),
    "downscale always (standard-like)": dict(downscale=1.0),
    "blur 1 px": dict(blur=1.0),
    "slant 10 + rotate 3 deg": dict(slant=10.0, rotate=3.0),
    "jitter 0.5 px + elastic 2 px": dict(jitter=0.5, elastic=2.0),
    "all of the above (downscale and antialias 0.5)": dict(width_min=0.5, width_max=1.5, pressure=0.3, antialias=0.5,
                                                           downscale=0.5, blur=1.0, slant=10.0, rotate=3.0,
                                                           jitter=0.5, elastic=2.0),
    "all but antialias (downscale 0.5)": dict(width_min=0.5, width_max=1.5, pressure=0.3, downscale=0.5, blur=1.0,
                                              slant=10.0, rotate=3.0, jitter=0.5, elastic=2.0),
}


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from hmer.config import DataConfig
    from hmer.data import RenderConfig, Vocab, collate, load_dataset, make_batches, open_source
    from hmer.data.augment import AugmentConfig, augmented_image, load_strokes

    shared = Path(__file__).resolve().parents[2] / "shared" / "crohme" / "crohme-inkml.zip"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", default=os.environ.get("HMER_DATA") or str(shared))
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--limit", type=int, default=0, help="time only the first N training expressions")
    args = p.parse_args()

    cfg = DataConfig(render_height=args.height)
    train = load_dataset(args.data, cfg, splits=("train",))["train"]
    if args.limit:
        train = train[: args.limit]
    t0, c0 = time.monotonic(), time.process_time()
    with open_source(args.data) as source:
        strokes = load_strokes(source, "train", [e.name for e in train])
    print(f"{len(train)} training expressions at {args.height} px; strokes loaded in "
          f"{time.monotonic() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU "
          "(once per run; cached after the first)")
    render_cfg = RenderConfig.from_data_config(cfg)
    vocab = Vocab()
    batches = make_batches(train, cfg.batch_pixels, cfg.max_batch_size, shuffle=True, seed=0)
    t0, c0 = time.monotonic(), time.process_time()
    for idx in batches:
        collate([train[i] for i in idx], vocab)
    print(f"for scale: collating the epoch's {len(batches)} batches takes {time.monotonic() - t0:.1f} s wall, "
          f"{time.process_time() - c0:.1f} s CPU\n")
    print("| setting (data.aug_share=1) | wall s / epoch | CPU s / epoch | CPU ms / image |")
    print("|---|---|---|---|")
    for label, options in SETTINGS.items():
        aug = AugmentConfig(share=1.0, **options)
        rng = np.random.default_rng(0)
        t0, c0 = time.monotonic(), time.process_time()
        for e in train:
            augmented_image(strokes[e.name], render_cfg, aug, rng)
        wall, cpu = time.monotonic() - t0, time.process_time() - c0
        print(f"| {label} | {wall:.1f} | {cpu:.1f} | {1000 * cpu / len(train):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
