"""The training loss over the first steps of an epoch, per seed: does a change of the step keep
the curve?

A speed-up that changes only how dropout draws its random numbers changes one run's single
losses but must leave the curve's mean over seeds where it was. This script trains the `small`
preset (or any) on real CROHME batches in a fixed order for `--steps` steps per seed, with the
trainer's step (loss, backward, clipping, optimiser), and writes the losses per seed to JSON.
`--compare OLD.json NEW.json` prints the mean loss per window of steps on both sides, their
difference, and the seeds' spread, which is what the difference must be read against.

    OMP_NUM_THREADS=1 PYTHONPATH=<old checkout>/src python benchmarks/loss_curve.py --out old.json
    OMP_NUM_THREADS=1 python benchmarks/loss_curve.py --out new.json
    python benchmarks/loss_curve.py --compare old.json new.json

It uses only APIs that have not changed since commit cf9f79f, so it runs against that
checkout's code too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def train_losses(preset: str, steps: int, seed: int, data: str, overrides: list[str]) -> list[float]:
    import numpy as np
    import torch

    from hmer.config import parse_overrides
    from hmer.data import Vocab, load_dataset, make_batches
    from hmer.model import build_model
    from hmer.model.accelerations import accelerate
    from hmer.model_presets import preset_with_recipe
    from hmer.training.loader import make_train_batch
    from hmer.training.optim import build_optimizer
    from hmer.training.step import LossModule

    cfg = preset_with_recipe(preset).override(parse_overrides(overrides))
    exprs = load_dataset(data, cfg.data, splits=("train",))["train"]
    batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    torch.manual_seed(seed)
    model = build_model(cfg.model)
    accelerate(model, torch.device("cpu"))  # as the trainer steps (training.setup.prepare_model)
    model.train()
    loss_module = LossModule(model)
    opt = build_optimizer(model.parameters(), cfg.train)
    vocab, dev = Vocab(), torch.device("cpu")
    rng = np.random.default_rng(seed)
    losses = []
    for idx in batches[:steps]:
        augment = cfg.data.scale_aug_max > 0
        scale = float(rng.uniform(cfg.data.scale_aug_min, cfg.data.scale_aug_max)) if augment else None
        tb = make_train_batch([exprs[i] for i in idx], vocab, cfg.model.direction, dev, scale)
        loss = loss_module(tb.batch.images, tb.batch.image_mask, tb.tgt_in, tb.tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def compare(old_path: str, new_path: str, window: int) -> None:
    old, new = (json.load(open(p)) for p in (old_path, new_path))
    steps = min(len(v) for side in (old, new) for v in side["losses"].values())
    print(f"old: {old['label']}\nnew: {new['label']}\nseeds: {sorted(old['losses'])} vs {sorted(new['losses'])}, "
          f"{steps} steps, mean loss per window of {window} steps")
    print(f"{'steps':>9}  {'old mean':>8}  {'new mean':>8}  {'new-old':>8}  {'old seeds sd':>12}  {'new seeds sd':>12}")

    def sd(xs):
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    for start in range(0, steps, window):
        def per_seed(side, start=start):
            return [statistics.fmean(v[start:start + window]) for v in side["losses"].values()]
        o, n = per_seed(old), per_seed(new)
        print(f"{start:>4}-{start + window - 1:<4}  {statistics.fmean(o):8.4f}  {statistics.fmean(n):8.4f}  "
              f"{statistics.fmean(n) - statistics.fmean(o):+8.4f}  {sd(o):12.4f}  {sd(n):12.4f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--data", default=os.environ.get("HMER_DATA"))
    p.add_argument("--set", nargs="*", default=["data.render_height=64"], dest="overrides")
    p.add_argument("--out")
    p.add_argument("--label", default="")
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    p.add_argument("--window", type=int, default=25)
    args = p.parse_args(argv)
    if args.compare:
        compare(*args.compare, args.window)
        return 0
    if not args.data or not args.out:
        p.error("--data (or $HMER_DATA) and --out are needed to train")
    result = {"label": args.label or os.environ.get("PYTHONPATH", "this checkout"), "preset": args.preset,
              "overrides": args.overrides, "losses": {}}
    for seed in args.seeds:
        t0 = time.perf_counter()
        result["losses"][str(seed)] = train_losses(args.preset, args.steps, seed, args.data, args.overrides)
        print(f"seed {seed}: {args.steps} steps in {time.perf_counter() - t0:.0f} s, "
              f"last loss {result['losses'][str(seed)][-1]:.4f}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
