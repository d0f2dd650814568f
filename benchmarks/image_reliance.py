"""How much does a decoder read the image? The validation loss of each target with its own image
and with another expression's image (the batch's images rolled by one): a model that reads the
image loses a lot when it gets the wrong one; a model that has learned only a language model of
LaTeX loses little.

Two uses:

    # trained runs of a store, as they are (for ConvS2S also its attention scores' spread and the
    # largest weight, trained and freshly initialised)
    python benchmarks/image_reliance.py --runs RUN [RUN ...] [--tracking-uri URI]

    # one epoch's worth of steps of a run's config, once per variant, from the same seed: which
    # variant learns to read the image (`--set` overrides the run's config for every variant)
    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/image_reliance.py --train-like RUN --steps 1000 \
        --variant model.conv_attention=gehring --variant model.conv_attention=scaled

Training here is the trainer's step (loss with the config's label smoothing, clipping, the
optimiser) with a linear warm-up over `train.warmup_steps` and no decay, on the run's training
batches in a fixed order with its scale augmentation; it is a probe of the first epoch, not a run.
The losses printed are without label smoothing, over the first `--val-batches` validation
batches of at least 4 expressions. The ConvS2S measurements in docs/architecture.md come from it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def validation_batches(exprs, vocab, cfg, val_batches: int) -> list:
    """The first `val_batches` validation batches of at least 4 expressions, with their targets
    (`loader.TrainBatch`), in the same fixed order for every measurement."""
    import torch

    from hmer.data import make_batches
    from hmer.training.loader import make_train_batch

    batches = [b for b in make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
               if len(b) >= 4][:val_batches]
    return [make_train_batch([exprs[i] for i in idx], vocab, cfg.model.direction, torch.device("cpu"), None)
            for idx in batches]


def image_reliance(model, batches: list) -> tuple[float, float]:
    """(mean validation loss with each expression's own image, with another's image)."""
    import torch

    own = other = 0.0
    model.eval()
    with torch.no_grad():
        for tb in batches:
            images, mask = tb.batch.images, tb.batch.image_mask
            rolled = torch.roll(torch.arange(images.shape[0]), 1)
            own += float(model.loss_from_targets(images, mask, tb.tgt_in, tb.tgt_out, 0.0))
            other += float(model.loss_from_targets(images[rolled], mask[rolled], tb.tgt_in, tb.tgt_out, 0.0))
    return own / len(batches), other / len(batches)


def attention_scores(model, batches: list) -> tuple[float, float]:
    """For a ConvS2S model: (std of its attention scores over unpadded positions, mean over queries
    of the largest attention weight), over every block and the validation batches."""
    import torch

    from hmer.model.convs2s import HALF, ImageAttention

    scores, largest = [], []

    def record(module, args, output):
        x, target_embedding, memory, pad, _ = args
        q = (module.in_proj(x) + target_embedding) * HALF
        s = torch.bmm(q, memory.transpose(1, 2)) * module.score_scale
        valid = ~pad[:, None, :].expand_as(s)
        scores.append(s[valid])
        largest.append(torch.softmax(s.masked_fill(~valid, float("-inf")), -1).amax(-1).flatten())

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, ImageAttention)]
    model.eval()
    with torch.no_grad():
        for tb in batches:
            model(tb.batch.images, tb.batch.image_mask, tb.tgt_in)
    for hook in hooks:
        hook.remove()
    return float(torch.cat(scores).std()), float(torch.cat(largest).mean())


def train_probe(cfg, train_exprs, vocab, steps: int, seed: int):
    """A model of `cfg` after `steps` training steps from `seed` (see the module's docstring)."""
    import numpy as np
    import torch

    from hmer.data import make_batches
    from hmer.model import build_model
    from hmer.model.accelerations import accelerate
    from hmer.training.loader import make_train_batch
    from hmer.training.optim import build_optimizer
    from hmer.training.step import LossModule, train_step

    torch.manual_seed(seed)
    model = build_model(cfg.model)
    accelerate(model, torch.device("cpu"))  # as the trainer steps (training.setup.prepare_model)
    model.train()
    loss_module = LossModule(model, cfg.train.label_smoothing)
    optimizer = build_optimizer(model.parameters(), cfg.train)
    warmup = max(1, cfg.train.warmup_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    batches = make_batches(train_exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    rng = np.random.default_rng(seed)
    start, window = time.perf_counter(), []
    for step, idx in enumerate(batches[:steps], 1):
        scale = (float(rng.uniform(cfg.data.scale_aug_min, cfg.data.scale_aug_max))
                 if cfg.data.scale_aug_max > 0 else None)
        tb = make_train_batch([train_exprs[i] for i in idx], vocab, cfg.model.direction, torch.device("cpu"), scale)
        window.append(float(train_step(loss_module, optimizer, model, tb, cfg.train.grad_clip).detach()))
        schedule.step()
        if step % 200 == 0 or step == min(steps, len(batches)):
            print(f"    step {step}: training loss {sum(window) / len(window):.3f} over the last {len(window)}, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
            window = []
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--runs", nargs="+", metavar="RUN", help="trained runs to measure as they are")
    what.add_argument("--train-like", metavar="RUN", help="train probes with this run's config")
    p.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="one probe per --variant, its overrides on the run's config (none: the config alone)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every probe")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--val-batches", type=int, default=25)
    p.add_argument("--tracking-uri", default=None, help="the store (default: the project's mlruns/ or $HMER_MLRUNS)")
    p.add_argument("--data", default=os.environ.get("HMER_DATA"), help="the CROHME zip (default: $HMER_DATA)")
    args = p.parse_args(argv)

    import torch

    from hmer.config import parse_overrides
    from hmer.data import load_dataset
    from hmer.tracking.models import load_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    splits = ("val",) if args.runs else ("train", "val")
    data_cache: dict = {}

    def dataset(cfg):
        path = args.data or cfg.data.path
        key = (path, cfg.data.render_height, cfg.data.render_style)
        if key not in data_cache:
            data_cache[key] = load_dataset(path, cfg.data, splits=splits)
        return data_cache[key]

    for run in args.runs or []:
        model, cfg, vocab = load_model(run, args.tracking_uri)
        batches = validation_batches(dataset(cfg)["val"], vocab, cfg, args.val_batches)
        own, other = image_reliance(model, batches)
        print(f"{run} ({cfg.model.decoder}): validation loss {own:.3f} with its own image, {other:.3f} with "
              f"another's, {other - own:+.3f}")
        if cfg.model.decoder == "convs2s":  # its attention, trained and freshly initialised (seed --seed)
            from hmer.model import build_model

            torch.manual_seed(args.seed)
            for label, m in (("trained", model), (f"initialised, seed {args.seed}", build_model(cfg.model))):
                spread, top = attention_scores(m, batches)
                print(f"  attention ({cfg.model.conv_attention}), {label}: scores' std {spread:.1f}, "
                      f"largest weight {top:.2f} on average")
    if args.train_like:
        _, run_cfg, vocab = load_model(args.train_like, args.tracking_uri)
        run_cfg = run_cfg.override(parse_overrides(args.set))
        for variant in args.variant or [""]:
            overrides = parse_overrides([v for v in variant.split(",") if v])
            cfg = run_cfg.override(overrides)
            label = variant or "the run's config"
            print(f"{label}: {args.steps} steps from seed {args.seed}", flush=True)
            data = dataset(cfg)
            model = train_probe(cfg, data["train"], vocab, args.steps, args.seed)
            own, other = image_reliance(model, validation_batches(data["val"], vocab, cfg, args.val_batches))
            print(f"{label}: validation loss {own:.3f} with its own image, {other:.3f} with another's, "
                  f"{other - own:+.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
