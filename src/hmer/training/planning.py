"""The batch shapes a training will see, planned before its first step.

With the pad ladder a training split's batches take a known, finite set of shapes, scale augmentation
included (`training_shapes`). On a GPU each costs cuDNN an execution plan per convolution the first
time it is seen (about 0.5 s a shape on the leases so far), so the plan cache is sized to the ladder
(`cache_plans`: cuDNN keeps 10,000 plans by default, fewer than a ladder's shapes times the encoder's
convolutions) and `plan` runs one pass over every shape (`train.plan_shapes`; docs/training.md, "Recipes").

The pass runs in eval mode with gradients on: the training's convolutions (plans do not depend on
the mode), BatchNorm's statistics untouched, no dropout draws, its gradients dropped; so a training
is the same with or without it (tests/test_training_graphs.py, on a CPU).

What it does not reach: the decoder's shapes follow the caption lengths, not the ladder. Its
matrix products need no plan, but CoMER's attention refinement convolves [rows x steps, heads, h, w]
maps, whose first side changes with the caption length; those plans are still built on first sight.
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

import torch

from ..model import HMERModel
from ..config import Config
from ..device import size_cudnn_plan_cache
from ..data import Expression, make_batches
from ..data.batching import padded_shapes
from ..data.batching import PadLadder, ladder_shapes
from ..model.accelerations import PointwiseConv


def training_shapes(cfg: Config, exprs: Sequence[Expression]) -> set[tuple[int, int, int]]:
    """Every (images, height, width) a training batch of `exprs` can take under `cfg`: the ladder's
    rungs for each batch at every scale of the augmentation's range. An epoch's batches hold the same
    expressions whatever its shuffle seed (`make_batches` only reorders them), so these are the
    shapes of every epoch. Renderer augmentation (`data.aug_*`) redraws images at other sizes; its
    shapes are planned on first sight."""
    data = cfg.data
    batches = make_batches(exprs, data.batch_pixels, data.max_batch_size, shuffle=False)
    scale_range = (data.scale_aug_min, data.scale_aug_max) if data.scale_aug_max > 0 else None
    return ladder_shapes(padded_shapes(exprs, batches), PadLadder.from_data_config(data), scale_range)


def plans_per_shape(model: torch.nn.Module) -> int:
    """cuDNN plans one batch shape costs: forward, backward to the data (not for the first
    convolution, whose input needs no gradient) and backward to the weights of every convolution of
    the model that runs through cuDNN (a 1x1 one computed as a matrix product needs none). CoMER's
    attention refinement is counted once, although its shapes follow the caption lengths too."""
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)
             and not (isinstance(m, PointwiseConv) and m.as_matmul)]
    return max(3 * len(convs) - 1, 0)


def cache_plans(model: torch.nn.Module, shapes: int, eval_shapes: int = 0) -> int:
    """Plans to keep for `shapes` training shapes and `eval_shapes` forward-only ones, with a quarter
    more for the shapes that fall off the ladder (renderer augmentation, the last batch)."""
    per_shape = plans_per_shape(model)
    forward = -(-per_shape // 3)
    return int(1.25 * (shapes * per_shape + eval_shapes * forward))


def prepare(setup) -> dict[str, float]:
    """Before a training's first step (`setup`: a `training.setup.Setup`): with the pad ladder on a
    GPU, size cuDNN's plan cache to the ladder's shapes; with `train.plan_shapes`, plan them all.
    Returns what it did, as numbers a run logs (empty when the ladder is off)."""
    cfg = setup.cfg
    if not PadLadder.from_data_config(cfg.data).enabled:
        return {}
    shapes = training_shapes(cfg, setup.train_set)
    done: dict[str, float] = {"ladder_shapes": float(len(shapes))}
    if setup.device.type == "cuda":  # and the shapes of validation and the test years (forward only)
        data, evaluated = cfg.data, set[tuple[int, int, int]]()
        for exprs in (setup.data.get(split) or [] for split in ("val", *setup.test_years)):
            batches = make_batches(exprs, data.eval_batch_pixels, data.eval_max_batch_size, shuffle=False,
                                   max_image_pixels=data.max_image_pixels)
            evaluated |= set(padded_shapes(exprs, batches, data.max_image_pixels, PadLadder.from_data_config(data)))
        limit, _ = size_cudnn_plan_cache(cache_plans(setup.model, len(shapes), len(evaluated)))
        done["cudnn_plan_cache"] = float(limit)
    if cfg.train.plan_shapes:
        n, seconds = plan(setup.model, shapes, setup.device, setup.amp_dtype, cfg.train.channels_last)
        done.update(planned_shapes=float(n), plan_seconds=seconds)
    return done


def plan(model: HMERModel, shapes: Iterable[tuple[int, int, int]], device: torch.device,
         amp_dtype: torch.dtype | None, channels_last: bool) -> tuple[int, float]:
    """One forward and backward pass of `model`'s encoder (and its projection to d_model) at each
    shape, as the training step runs it (module docstring). Returns (shapes, seconds)."""
    was_training = model.training
    model.eval()
    start, n = time.perf_counter(), 0
    try:
        for images_n, height, width in sorted(shapes):
            images = torch.zeros(images_n, 1, height, width, device=device)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            mask = torch.zeros(images_n, height, width, dtype=torch.bool, device=device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                feats, _ = model.encode(images, mask)
            feats.float().sum().backward()
            n += 1
    finally:
        for p in model.parameters():
            p.grad = None
        model.train(was_training)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n, time.perf_counter() - start
