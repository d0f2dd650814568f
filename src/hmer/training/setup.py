"""Everything one training builds from its config before the first step: data, model, optimiser.

The order of `build` is part of the numerics: the model's initial weights are drawn from the torch
RNG right after `seed_everything`, so a run with the same seed starts from the same weights.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import Config
from ..data import Expression, Vocab, load_dataset, make_batches
from ..device import autocast_dtype
from ..model import build_model
from . import distributed as ddp
from .loader import auto_prefetch
from .recipes import LRSchedule, build_optimizer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class LossModule(torch.nn.Module):
    """`forward` = the model's training loss, so DistributedDataParallel can wrap it."""

    def __init__(self, model: torch.nn.Module, label_smoothing: float = 0.0):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, images, image_mask, tgt_in, tgt_out):
        return self.model.loss_from_targets(images, image_mask, tgt_in, tgt_out, self.label_smoothing)


@dataclass
class Setup:
    """One training's parts. `loss_module` is the model's loss, wrapped for DDP and compiled as asked;
    `model` is the bare model (its state_dict is what checkpoints hold)."""

    cfg: Config
    vocab: Vocab
    data: dict[str, list[Expression]]
    test_years: list[str]
    model: torch.nn.Module
    loss_module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    device: torch.device
    amp_dtype: torch.dtype | None
    dist: ddp.DistInfo
    prefetch: int
    num_params: int

    @property
    def train_set(self) -> list[Expression]:
        return self.data["train"]

    @property
    def val_set(self) -> list[Expression]:
        return self.data.get("val", [])


def build(cfg: Config, data: dict[str, list] | None, device: torch.device, dist: ddp.DistInfo) -> Setup:
    """The parts of a training of `cfg` (data loaded from `cfg.data` when not given)."""
    tc = cfg.train
    vocab = Vocab()
    if cfg.model.vocab_size != len(vocab):
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} but the vocabulary has {len(vocab)} tokens")
    if data is None:
        data = load_dataset(cfg.data.path or None, cfg.data)
    if not data["train"]:
        raise ValueError("the training split is empty")
    test_years = [y.strip() for y in cfg.data.test_years.split(",") if y.strip() and y.strip() in data]

    model = build_model(cfg.model).to(device)
    if tc.channels_last:  # NHWC convolutions for the encoder (tensor cores prefer them on a GPU)
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(model.parameters(), tc)
    # make_batches fixes the number of batches of an epoch whatever its shuffle seed
    steps_per_epoch = len(ddp.shard(make_batches(data["train"], cfg.data.batch_pixels, cfg.data.max_batch_size,
                                                 shuffle=True, seed=0), dist))
    schedule = LRSchedule(optimizer, tc, total_steps=steps_per_epoch * tc.epochs)
    loss_module: Any = ddp.wrap(LossModule(model, cfg.train.label_smoothing), dist, device)
    if tc.compile:
        loss_module = torch.compile(loss_module, dynamic=True)
    return Setup(cfg=cfg, vocab=vocab, data=data, test_years=test_years, model=model, loss_module=loss_module,
                 optimizer=optimizer, schedule=schedule, device=device,
                 amp_dtype=autocast_dtype(tc.precision, device), dist=dist,
                 prefetch=auto_prefetch(cfg.data.prefetch, device),
                 num_params=sum(p.numel() for p in model.parameters()))
