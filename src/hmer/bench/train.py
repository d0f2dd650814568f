"""`hmer bench train`: the trainer's step over the trainer's input pipeline."""

from __future__ import annotations

import numpy as np
import torch

from .setup import Bench
from .timing import flop_line, print_batching, print_rate, print_timing, timed


def bench_train(b: Bench) -> int:
    from ..data import Vocab, make_batches
    from ..data.batching import PadLadder
    from ..training.graphs import GraphedStep
    from ..training.loader import make_train_batch
    from ..training.optim import build_optimizer
    from ..training.planning import cache_plans, plan, training_shapes
    from ..training.step import LossModule, train_step
    from ..device import size_cudnn_plan_cache

    cfg, exprs, dev, out = b.cfg, b.exprs, b.device, b.out
    ladder = PadLadder.from_data_config(cfg.data)
    batches = make_batches(exprs, cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    print_batching(b, batches, ladder, None)
    if ladder.enabled:
        shapes = training_shapes(cfg, exprs)
        line = f"ladder_shapes={len(shapes)}"
        if b.gpu:  # before the first convolution of the process: torch reads it once
            limit, how = size_cudnn_plan_cache(cache_plans(b.model, len(shapes)))
            line += f" cudnn_plan_cache={limit} ({how})"
        print(line, file=out)
        if cfg.train.plan_shapes:
            n, seconds = plan(b.model, shapes, dev, b.amp, cfg.train.channels_last)
            print(f"planned_shapes={n} plan_seconds={seconds:.2f}", file=out)
    opt = build_optimizer(b.model.parameters(), cfg.train)
    b.model.train()
    loss_module: torch.nn.Module = LossModule(b.model, cfg.train.label_smoothing)
    compiled = bool(cfg.train.compile)
    if compiled:
        # a compiled Module is a Module (OptimizedModule); torch.compile's stubs say only Callable
        loss_module = torch.compile(loss_module, dynamic=True)  # type: ignore[assignment]
    aug_rng = np.random.default_rng(0)
    vocab = Vocab()

    def make(idx):
        scale = None
        if cfg.data.scale_aug_max > 0:  # the trainer's per-batch scale augmentation (CoMER)
            scale = float(aug_rng.uniform(cfg.data.scale_aug_min, cfg.data.scale_aug_max))
        return make_train_batch([exprs[i] for i in idx], vocab, cfg.model.direction, dev, scale,
                                cfg.train.channels_last, ladder)

    def ordinary(tb):
        train_step(loss_module, opt, b.model, tb, cfg.train.grad_clip, b.amp)
        return len(tb)

    graphed = GraphedStep(loss_module, opt, b.model, cfg.train.grad_clip, b.amp) if cfg.train.cuda_graphs else None

    def step(tb):
        if graphed is None:
            return ordinary(tb)
        graphed(tb)
        return len(tb)

    warmup = b.knobs["warmup"] if b.knobs["warmup"] >= 0 else (6 if compiled else 2)
    timing = timed(b, batches, make, step, warmup)
    if graphed is not None:
        print(f"graphs={graphed.graphs} graph_failures={len(graphed.failures)}"
              + (f" first_failure={next(iter(graphed.failures.values()))[:200]!r}" if graphed.failures else ""),
              file=out)
    # FLOPs through the ordinary step: a graph's replay runs no operator the counter could see
    flops = flop_line(b, timing, lambda items: [ordinary(tb) for tb in items], make, default_batches=8, epoch=batches)
    print_timing(b, timing, flops)
    print(f"epoch_seconds_8835={8835 / timing.images_per_second:.1f}", file=out)
    print_rate(b, timing)
    return 0
