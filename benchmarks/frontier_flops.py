"""The training FLOPs an image of each frontier setting: the x-axis of `hmer report --frontier`.

    python benchmarks/frontier_flops.py                  # every planned setting, a few minutes each
    python benchmarks/frontier_flops.py --batches 64 --out /tmp/flops.csv

The frontier (issue 66) plots validation ExpRate against training compute in a unit that does not
depend on the host: the FLOPs of one training step's image (forward and backward, counted by
`torch.utils.flop_counter` in `hmer bench train`) times the images a run trained. Only the model and
the input scale change an image's FLOPs, not the weight average nor the length, so each (width,
input scale) of the study's planned variants is measured once: `hmer bench train` on the cell's own
config (resolved as the study resolves it, `hmer.studies.resolution`) over real CROHME training
batches (the trainer's batching and scale augmentation), counting `--batches` of them spread evenly
over the epoch's batches sorted by size, each standing for its share (`bench.flop_spread=1`): the
first batches of a shuffle are a small random sample of sizes, and 32 of them read 1.82 GFLOP an image
at 0.5 against 1.88 at 48 px, where the images are larger. FLOPs are a count, not a timing: the same
on every host and under any load. The training images of an epoch are
counted from the same split the study trains on.

It writes one row a setting (`SETTING_KEYS`, `gflop_per_image`, `train_images`, the batches and
images counted, the command) to `benchmarks/results/frontier_flops.csv`, which the report reads.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from hmer.studies.frontier_report import SETTING_KEYS

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "frontier_flops.csv"


def planned_settings(budget_name: str) -> list[tuple[tuple, dict]]:
    """(setting, the config of its first planned cell, flat) for each planned (width, input scale)."""
    from hmer.studies.budgets import get_budget
    from hmer.studies.resolution import cell_resolution, study_resolution
    from hmer.studies.spec import SEED_KEY
    from hmer.studies.suite.frontier import FRONTIER

    budget = get_budget(budget_name)
    base = study_resolution(FRONTIER, budget, n_trials=1, n_jobs=1)
    settings: dict[tuple, dict] = {}
    for cell in FRONTIER.variant_cells(FRONTIER.variants):
        setting = tuple(cell[k] for k in SETTING_KEYS)
        if setting not in settings:
            settings[setting] = cell_resolution(base, FRONTIER, {**cell, SEED_KEY: 1}).config.to_dict()
    return list(settings.items())


def measure(config: dict, data: str, images: int, batches: int) -> dict[str, float]:
    """`hmer bench train` on `config`: its FLOPs an image, from `batches` batches spread over the epoch."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        command = [sys.executable, "-m", "hmer.cli", "bench", "train", "--config", str(path), "--data", data,
                   "--device", "cpu", "--images", str(images), "--set", f"bench.flop_batches={batches}",
                   "bench.flop_spread=1"]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"hmer bench train failed:\n{done.stderr[-2000:]}")
    found = dict(re.findall(r"(\w+)=([0-9.]+)", done.stdout))
    return {"gflop_per_image": float(found["gflop_per_image"])}


def train_images(config: dict, data: str) -> int:
    """The expressions of the training split the study's runs train on (after the writer hold-out)."""
    from hmer.config import Config
    from hmer.data import load_dataset

    cfg = Config.from_dict(config)
    return len(load_dataset(data, cfg.data, splits=("train",))["train"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", default="cpu", help="the study's budget (default: cpu)")
    p.add_argument("--data", default=os.environ.get("HMER_DATA"), help="the CROHME data (default: $HMER_DATA)")
    p.add_argument("--batches", type=int, default=48, help="training batches whose FLOPs are counted, spread "
                   "over the epoch's sizes (default: 48)")
    p.add_argument("--images", type=int, default=32, help="images in the timed region, which the count does not "
                   "need (default: 32)")
    p.add_argument("--out", type=Path, default=OUT, help=f"the CSV written (default: {OUT.relative_to(ROOT)})")
    args = p.parse_args()
    if not args.data:
        print("frontier_flops: no CROHME data: give --data or set HMER_DATA", file=sys.stderr)
        return 2
    rows = []
    for setting, config in planned_settings(args.budget):
        figures = measure(config, args.data, args.images, args.batches)
        row = {**dict(zip(SETTING_KEYS, setting)), **figures, "batches_counted": args.batches,
               "train_images": train_images(config, args.data),
               "command": f"python benchmarks/frontier_flops.py --batches {args.batches} --images {args.images}"}
        print(", ".join(f"{k}={v}" for k, v in row.items() if k != "command"), flush=True)
        rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
