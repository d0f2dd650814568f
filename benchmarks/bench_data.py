"""How long the data layer takes on this machine: rendering every expression into the cache
(cold, into a fresh temporary cache folder), loading the cache back (warm), and the batching
figures a training epoch sees.

    python benchmarks/bench_data.py [DATA] [--workers N]

DATA defaults to $HMER_DATA, then ../shared/crohme/crohme-inkml.zip beside the checkout. The lines
printed are what goes into docs/data.md, with this command, the date and the machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from hmer.config import DataConfig
    from hmer.data import (RenderConfig, load_dataset, make_batches, open_source, padded_shapes, padding_share,
                           parse_inkml, render_ink)
    from hmer.data.cache import default_workers
    from hmer.data.batching import PadLadder

    shared = Path(__file__).resolve().parents[2] / "shared" / "crohme" / "crohme-inkml.zip"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", default=os.environ.get("HMER_DATA") or str(shared))
    p.add_argument("--workers", type=int, default=None, help="render processes (default: all cores)")
    args = p.parse_args()
    workers = args.workers or default_workers()
    splits = ("train", "2014", "2016", "2019")
    cfg = DataConfig(val_fraction=0.0)  # whole splits: every expression is rendered and counted

    from hmer.tracking.store import git_commit

    commit = git_commit(short=True, root=Path(__file__).parent)  # "-dirty" with uncommitted changes
    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M} commit={commit} python={platform.python_version()}")
    print(f"# machine: {platform.machine()}, {os.cpu_count()} CPU cores ({platform.processor() or 'unknown cpu'})")
    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"data={args.data} workers={workers} load_average_before={os.getloadavg()[0]:.2f} "
          "(other processes share these cores)")

    with tempfile.TemporaryDirectory(prefix="hmer-bench-cache-") as cache:
        os.environ["HMER_CACHE"] = cache
        start = time.perf_counter()
        cold = load_dataset(args.data, cfg, splits=splits, workers=workers)
        cold_s = time.perf_counter() - start
        n = sum(len(v) for v in cold.values())
        size_mb = sum(f.stat().st_size for f in Path(cache).iterdir()) / 2**20
        del cold

        start = time.perf_counter()
        warm = load_dataset(args.data, cfg, splits=splits, workers=workers)
        warm_s = time.perf_counter() - start

    pixels = sum(e.image.size for v in warm.values() for e in v)
    print(f"expressions={n} " + " ".join(f"{k}={len(v)}" for k, v in warm.items()))
    print(f"cold_render_seconds={cold_s:.1f} cold_images_per_second={n / cold_s:.0f} "
          f"per_image_core_ms={1000 * cold_s * workers / n:.2f}")
    print(f"warm_load_seconds={warm_s:.2f} warm_images_per_second={n / warm_s:.0f}")
    print(f"cache_mb={size_mb:.1f} in_memory_mb={pixels / 2**20:.0f}")

    # One process, no pool and no cache: the cost of one expression, parse + render.
    with open_source(args.data) as source:
        names = sorted(source.list_files("2014"))[:300]
        blobs = [source.read_bytes("2014", f"{n}.inkml") for n in names]

    start = time.perf_counter()
    inks = [parse_inkml(b, n) for n, b in zip(names, blobs)]
    parse_s = time.perf_counter() - start
    start = time.perf_counter()
    for ink in inks:
        render_ink(ink, RenderConfig())
    render_s = time.perf_counter() - start
    print(f"one_process_parse_ms={1000 * parse_s / len(inks):.2f} "
          f"one_process_render_ms={1000 * render_s / len(inks):.2f} "
          f"(mean over {len(inks)} 2014 expressions)")

    train = warm["train"]
    start = time.perf_counter()
    batches = make_batches(train, cfg.batch_pixels, cfg.max_batch_size, shuffle=True, seed=0)
    print(f"make_batches_ms={1000 * (time.perf_counter() - start):.0f} batches={len(batches)} "
          f"padding_share={padding_share(train, batches):.3f} "
          f"(train, {cfg.batch_pixels} px budget, max {cfg.max_batch_size} per batch)")
    # The padding of the default sort (height bins of 16 px, then width) against BTTR's exact
    # (height, width) sort, for training and for evaluation batches.
    max_px = cfg.max_image_pixels
    for split, budget, cap, limit in (("train", cfg.batch_pixels, cfg.max_batch_size, None),
                                      ("2014", cfg.eval_batch_pixels, cfg.eval_max_batch_size, max_px)):
        exprs = warm[split]
        shares = {b: padding_share(exprs, make_batches(exprs, budget, cap, shuffle=False, max_image_pixels=limit,
                                                       height_bin=b), limit) for b in (1, 16)}
        print(f"padding_{split}_exact_sort={shares[1]:.3f} padding_{split}_height_bins_16={shares[16]:.3f} "
              f"({split}, {budget} px budget, max {cap} per batch)")
    # data.pad_multiple: distinct batch shapes in an epoch (each costs ~0.5 s on a GPU, docs/benchmarks.md
    # section 5) against the padding it adds; the same training batches as above. The geometric ladder
    # (data.pad_growth) and scale augmentation: benchmarks/bench_ladder.py.
    for multiple in (1, 16, 32, 64, 128):
        ladder = PadLadder(multiple)
        shapes = padded_shapes(train, batches, ladder=ladder)
        print(f"pad_multiple={multiple} shapes={len(set(shapes))} heights_widths={len({s[1:] for s in shapes})} "
              f"padding_share={padding_share(train, batches, ladder=ladder):.3f} (train, as above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
