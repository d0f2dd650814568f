"""What one training image costs on this thread, measured on real batches: how a CPU budget becomes epochs.

A sweep over what learns fastest per CPU-minute must give every trial the same compute, not the same epochs (a
48 px model runs about twice the epochs of an 80 px one). Training runs fixed epochs, independent of the machine's
load, so a trial measures its CPU seconds per image on its own batches and trains
`cpu_seconds / (seconds_per_image * training images)` epochs: a config value, so the run reproduces.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np
import torch

from ..config import Config
from ..data import Expression, RenderConfig, Vocab, make_batches, open_source
from ..data.augment import AugmentConfig, load_strokes
from ..data.batching import PadLadder
from ..model import build_model
from .loader import Redraw, train_batches
from .optim import build_optimizer
from .setup import prepare_model
from .step import LossModule, train_step


def train_seconds_per_image(cfg: Config, exprs: Sequence[Expression], n_batches: int = 8, seed: int = 0) -> float:
    """CPU seconds (all threads) per training image of `cfg`'s step on a sample of its batches, after one
    untimed step. Batch preparation counts (redrawing every image costs as much as the step itself). A fresh
    model; the torch RNG state is restored, so the training that follows is unchanged."""
    batches = make_batches(list(exprs), cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=seed)
    sample = batches[: n_batches + 1]
    redraw = None
    aug = AugmentConfig.from_data_config(cfg.data)
    if aug.enabled:
        names = [exprs[i].name for idx in sample for i in idx]
        with open_source(cfg.data.path or None) as source:
            strokes = load_strokes(source, "train", names)
        redraw = Redraw(strokes, RenderConfig.from_data_config(cfg.data), aug, np.random.default_rng([seed, 0, 1]))
    rng_state = torch.get_rng_state()
    try:
        model = prepare_model(build_model(cfg.model), cfg.train)
        model.train()
        loss_module = LossModule(model, cfg.train.label_smoothing)
        opt = build_optimizer(model.parameters(), cfg.train)
        steps = train_batches(exprs, sample, Vocab(), cfg.model.direction, torch.device("cpu"),
                              scale_range=(cfg.data.scale_aug_min, cfg.data.scale_aug_max),
                              rng=np.random.default_rng(seed), channels_last=cfg.train.channels_last,
                              redraw=redraw, ladder=PadLadder.from_data_config(cfg.data))
        images, cpu = 0, 0.0
        for k in range(len(sample)):
            t0 = time.process_time()
            tb = next(steps)
            train_step(loss_module, opt, model, tb, cfg.train.grad_clip)
            if k > 0:  # the first step warms the allocator and the kernels up
                cpu += time.process_time() - t0
                images += len(tb)
    finally:
        torch.set_rng_state(rng_state)
    return cpu / max(images, 1)


def epochs_for_budget(cpu_seconds: float, seconds_per_image: float, n_images: int, max_epochs: int) -> int:
    """The whole epochs of `n_images` that fit `cpu_seconds` (at least 1, at most `max_epochs`)."""
    fit = math.floor(cpu_seconds / max(seconds_per_image * n_images, 1e-9))
    return int(min(max(fit, 1), max_epochs))
