"""What the pad ladder (`data.pad_multiple`, `data.pad_growth`; hmer.data.batching) costs and saves on
the real training split: distinct batch shapes against padding, without and with scale augmentation.

    python benchmarks/bench_ladder.py [--data ZIP] [--ladders 1:1,64:1,16:1.25,32:1.33] [--epochs 5]

For each ladder (multiple:growth) it prints, for the `bttr` recipe (no augmentation) and the
`comer-fusion` recipe (scale augmentation x0.7-1.4 per batch), both at the reference batch setting
(320,000 px, at most 16 images):

  shapes_epoch     distinct (images, height, width) of one epoch's batches (the first pass's new shapes)
  shapes_epochs    distinct over `--epochs` epochs, batches and scales drawn as the trainer draws them
                   (seed 7: the order from (seed, epoch), the scales from the generator [seed, epoch])
  ladder_shapes    every shape the ladder can give these batches at any scale of the range: what
                   `train.plan_shapes` warms up (hmer.training.planning.training_shapes)
  padding          padded pixels / all pixels over those epochs (scaled images, as collate pads them)
  plans            ladder_shapes x the cuDNN plans a shape costs the preset's encoder (convolution
                   forward and both backward passes; with the 1x1 ones as matrix products in brackets)

Nothing here needs a GPU: the figures are counts over the data. Each new shape costs about 0.5 s of
host time on the leases' GPUs so far (docs/benchmarks.md section 5).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import numpy as np


def main() -> int:
    from hmer.data import load_dataset, make_batches, padded_shapes, padding_share
    from hmer.data.batching import PadLadder
    from hmer.model import build_model
    from hmer.model.accelerations import use_matmul
    from hmer.model_presets import preset_with_recipe
    from hmer.training.planning import plans_per_shape, training_shapes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("HMER_DATA"), help="CROHME zip or folder (default: $HMER_DATA)")
    p.add_argument("--ladders", default="1:1,16:1,64:1,16:1.2,16:1.25,32:1.25,32:1.33,16:1.5")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=7, help="train.seed, as the trainer draws from it")
    args = p.parse_args()
    if not args.data:
        p.error("give --data or set HMER_DATA")
    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M} {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    recipes = {name: preset_with_recipe(name) for name in ("bttr", "comer-fusion")}
    train = load_dataset(args.data, recipes["bttr"].data, splits=("train",))["train"]
    print(f"training expressions={len(train)} data={args.data}")
    plans = {}
    for name, cfg in recipes.items():
        model = build_model(cfg.model)
        convs = plans_per_shape(model)
        use_matmul(model, True)
        plans[name] = (convs, plans_per_shape(model))
    for spec in args.ladders.split(","):
        multiple, growth = spec.split(":")
        ladder = PadLadder(int(multiple), float(growth))
        for name, base in recipes.items():
            cfg = base.override({"data.pad_multiple": ladder.multiple, "data.pad_growth": ladder.growth})
            data = cfg.data
            augment = data.scale_aug_max > 0
            seen: set = set()
            first = 0
            total_padding = []
            for epoch in range(1, args.epochs + 1):
                batches = make_batches(train, data.batch_pixels, data.max_batch_size, shuffle=True,
                                       seed=args.seed * 100_003 + epoch)
                rng = np.random.default_rng([args.seed, epoch])
                scales = [float(rng.uniform(data.scale_aug_min, data.scale_aug_max)) for _ in batches] if augment \
                    else None
                seen |= set(padded_shapes(train, batches, ladder=ladder, scales=scales))
                first = first or len(seen)
                total_padding.append(padding_share(train, batches, ladder=ladder, scales=scales))
            all_shapes = len(training_shapes(cfg, train)) if ladder.enabled else None
            per_shape, per_shape_mm = plans[name]
            plan_text = (f"{all_shapes * per_shape} ({all_shapes * per_shape_mm})" if all_shapes is not None else "-")
            print(f"ladder={spec:8s} recipe={name:12s} scale_aug={'0.7-1.4' if augment else 'none':7s} "
                  f"batches={len(batches)} shapes_epoch={first} shapes_epochs={len(seen)} "
                  f"ladder_shapes={all_shapes if all_shapes is not None else '-'} "
                  f"padding={np.mean(total_padding):.3f} plans={plan_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
