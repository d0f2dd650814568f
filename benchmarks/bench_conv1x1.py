"""The 1x1 convolutions as convolutions or as matrix products (`train.conv1x1_as_matmul`), side by side
in one process: the same weights, the same batches, rounds alternating between the two.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_conv1x1.py --preset small --set data.render_height=64
    python benchmarks/bench_conv1x1.py --device cuda --preset bttr        # on a GPU

Prints, per round, the images a second of `--steps` training steps (`training.step.train_step`,
as the trainer steps) and of the encoder's forward and backward alone, for each side, then the
medians and their ratio, and how far apart the two sides' losses and features are on one batch (the
products are summed in another order, so they differ by float rounding). Batches come from the
training split when `--data` (or $HMER_DATA) is given, else from `hmer.bench`'s synthetic images; on a
CPU every side sees the same shapes again each round, so what is compared is the steady state.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

from hmer.allocator import tune_malloc
from hmer.bench.setup import synthetic_expressions
from hmer.config import parse_overrides
from hmer.data import Vocab, load_dataset, make_batches
from hmer.device import autocast_dtype, resolve_device
from hmer.model import build_model
from hmer.model.accelerations import use_matmul
from hmer.model_presets import preset_with_recipe
from hmer.training.loader import make_train_batch
from hmer.training.optim import build_optimizer
from hmer.training.setup import prepare_model
from hmer.training.step import LossModule, train_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--device", default="cpu")
    p.add_argument("--data", default=os.environ.get("HMER_DATA"), help="CROHME zip or folder (default: synthetic)")
    p.add_argument("--steps", type=int, default=6, help="training steps a round and side")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    tune_malloc()
    cfg = preset_with_recipe(args.preset).override(parse_overrides(args.overrides))
    dev = resolve_device(args.device)
    amp = autocast_dtype(cfg.train.precision, dev)
    if args.data:
        exprs = load_dataset(args.data, cfg.data, splits=("train",))["train"]
        source = f"CROHME train ({args.data})"
    else:
        exprs = synthetic_expressions(2000)
        source = "synthetic"
    batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    batches = batches[:args.steps]
    cl = bool(cfg.train.channels_last)
    steps = [make_train_batch([exprs[i] for i in idx], Vocab(), cfg.model.direction, dev, None, cl) for idx in batches]
    torch.manual_seed(0)
    base = build_model(cfg.model).to(dev)
    sides = {}
    for name, on in (("conv", False), ("matmul", True)):
        model = prepare_model(copy.deepcopy(base), cfg.train)
        use_matmul(model, on)
        model.train()
        sides[name] = (model, LossModule(model, cfg.train.label_smoothing),
                       build_optimizer(model.parameters(), cfg.train))
    n_images = sum(len(tb) for tb in steps)
    print(f"preset={args.preset} device={dev} precision={amp or torch.float32} threads={torch.get_num_threads()} "
          f"channels_last={cl} source={source} steps={len(steps)} images_a_round={n_images} "
          f"pointwise_convs={use_matmul(sides['conv'][0], False)}")

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def train_round(side) -> float:
        model, loss_module, opt = side
        sync()
        start = time.perf_counter()
        for tb in steps:
            train_step(loss_module, opt, model, tb, cfg.train.grad_clip, amp)
        sync()
        return n_images / (time.perf_counter() - start)

    def encoder_round(side) -> float:
        model = side[0]
        sync()
        start = time.perf_counter()
        for tb in steps:
            with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
                feats, _ = model.encoder(tb.batch.images, tb.batch.image_mask)
            feats.float().square().mean().backward()
        sync()
        return n_images / (time.perf_counter() - start)

    # the numerics first, on fresh copies: one batch, eval mode (no dropout), then one training loss
    with torch.no_grad():
        a, b = (copy.deepcopy(sides[n][0]).eval() for n in ("conv", "matmul"))
        tb = steps[0]
        fa, _ = a.encode(tb.batch.images, tb.batch.image_mask)
        fb, _ = b.encode(tb.batch.images, tb.batch.image_mask)
        la = a.loss_from_targets(tb.batch.images, tb.batch.image_mask, tb.tgt_in, tb.tgt_out)
        lb = b.loss_from_targets(tb.batch.images, tb.batch.image_mask, tb.tgt_in, tb.tgt_out)
    print(f"features_max_abs_diff={float((fa - fb).abs().max()):.3g} "
          f"features_rel_diff={float((fa - fb).norm() / fa.norm()):.3g} loss_conv={float(la):.7f} "
          f"loss_matmul={float(lb):.7f}")

    for name in sides:  # warm-up: allocator, kernels, optimiser state
        train_round(sides[name])
    figures: dict[str, dict[str, list[float]]] = {n: {"train": [], "encoder": []} for n in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            figures[name]["train"].append(train_round(sides[name]))
            figures[name]["encoder"].append(encoder_round(sides[name]))
        print(f"round {r + 1}: " + "  ".join(
            f"{n} train {figures[n]['train'][-1]:.2f} img/s, encoder fwd+bwd {figures[n]['encoder'][-1]:.2f} img/s"
            for n in order))
    for what in ("train", "encoder"):
        med = {n: statistics.median(figures[n][what]) for n in sides}
        print(f"median_{what}_img_s conv={med['conv']:.2f} matmul={med['matmul']:.2f} "
              f"matmul_over_conv={med['matmul'] / med['conv']:.3f}")


if __name__ == "__main__":
    main()
