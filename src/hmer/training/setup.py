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
from ..data import Expression, Vocab, load_dataset, make_batches, open_source
from ..data.vocab import SPECIALS, STRUCTURE_TOKENS
from ..data.augment import VAL_ALT, AugmentConfig, load_strokes, val_alt_render_config
from ..data.render import RenderConfig, render_ink
from ..data.standard import STANDARD_2014, standard_2014_if_available
from ..device import autocast_dtype
from ..model import HMERModel, build_model
from ..model.accelerations import accelerate
from . import distributed as ddp
from .ema import WeightAverage
from .graphs import GraphedStep
from .loader import auto_prefetch
from .optim import LRSchedule, batch_scaled_lr, build_optimizer, warmup_steps
from .step import LossModule


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def counted_classes(vocab: Vocab) -> torch.Tensor:
    """[V] bool: the classes CAN's counting loss counts, every symbol but the pad, start and end tokens
    and the structure tokens `{ } ^ _` (hmer.model.counting)."""
    counted = torch.ones(len(vocab), dtype=torch.bool)
    counted[[vocab.stoi[token] for token in (*SPECIALS, *STRUCTURE_TOKENS)]] = False
    return counted


def prepare_model(model: HMERModel, tc) -> HMERModel:
    """The model as the step runs it: NHWC with `train.channels_last` (tensor cores prefer it; 1.11x on one CPU
    thread) and its device's accelerations (hmer.model.accelerations). None changes a parameter."""
    if tc.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # stubs omit it
    accelerate(model, next(model.parameters()).device, tc.conv1x1_as_matmul)
    return model


@dataclass
class Setup:
    """One training's parts. `loss_module`: the loss, wrapped for DDP and compiled (None once the epochs are
    over); `model`: the bare model, whose state_dict checkpoints hold."""

    cfg: Config
    vocab: Vocab
    data: dict[str, list[Expression]]
    test_years: list[str]
    model: torch.nn.Module
    loss_module: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    device: torch.device
    amp_dtype: torch.dtype | None
    dist: ddp.DistInfo
    prefetch: int
    num_params: int
    train_strokes: dict[str, list[np.ndarray]] | None = None
    # train.lr scaled by train.lr_scaling, and k: how many times more images a step holds than the reference batch
    lr: float = 0.0
    batch_scale: float = 1.0
    ema: WeightAverage | None = None
    graphed: GraphedStep | None = None

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
    data = dict(data)  # the restyled splits below are this run's, not the caller's
    test_years = [y.strip() for y in cfg.data.test_years.split(",") if y.strip() and y.strip() in data]
    train_strokes = _add_restyled_splits(cfg, data, test_years)

    model = prepare_model(build_model(cfg.model).to(device), tc)
    # make_batches fixes the number of batches of an epoch whatever its shuffle seed
    batches = make_batches(data["train"], cfg.data.batch_pixels, cfg.data.max_batch_size, shuffle=True, seed=0)
    steps_per_epoch = len(ddp.shard(batches, dist))
    lr, batch_scale = tc.lr, 1.0
    if tc.lr_scaling != "none":
        reference = make_batches(data["train"], tc.lr_reference_batch_pixels, tc.lr_reference_max_batch_size,
                                 shuffle=True, seed=0)
        lr, batch_scale = batch_scaled_lr(tc, len(batches), len(reference))
    optimizer = build_optimizer(model.parameters(), tc, lr)
    schedule = LRSchedule(optimizer, tc, total_steps=steps_per_epoch * tc.epochs,
                          warmup=warmup_steps(tc, steps_per_epoch))
    counted = counted_classes(vocab).to(device) if cfg.model.counting else None
    loss_module: Any = ddp.wrap(LossModule(model, cfg.train.label_smoothing, counted, tc.counting_weight), dist, device)
    if tc.compile:
        loss_module = torch.compile(loss_module, dynamic=True)
    ema = WeightAverage(model, tc.ema_decay) if tc.ema_decay > 0 else None
    amp_dtype = autocast_dtype(tc.precision, device)
    graphed = None
    if tc.cuda_graphs:
        if dist.world_size > 1:
            raise ValueError("train.cuda_graphs captures one process's step; under torchrun (DDP) leave it off")
        graphed = GraphedStep(loss_module, optimizer, model, tc.grad_clip, amp_dtype)
    return Setup(cfg=cfg, vocab=vocab, data=data, test_years=test_years, model=model, loss_module=loss_module,
                 optimizer=optimizer, schedule=schedule, device=device, ema=ema, graphed=graphed,
                 amp_dtype=amp_dtype, dist=dist, prefetch=auto_prefetch(cfg.data.prefetch, device),
                 num_params=sum(p.numel() for p in model.parameters()), train_strokes=train_strokes, lr=lr,
                 batch_scale=batch_scale)


def _add_restyled_splits(cfg: Config, data: dict[str, list], test_years: list[str]) -> dict | None:
    """Add the splits of other renderings (issue 26): `val-alt` (`data.val_alt` style) and `2014-std` (the
    standard 2014 images, when beside the checkout; appended to `test_years`). Returns the training strokes
    when `data.aug_share` redraws training images, else None."""
    augmenting = AugmentConfig.from_data_config(cfg.data).enabled
    val = data.get("val") or []
    # Validation redrawn in its own style would score the same: no second validation then.
    restyled = bool(cfg.data.val_alt) and cfg.data.val_alt != cfg.data.render_style and bool(val)
    strokes = None
    if augmenting or restyled:
        names = [e.name for e in data["train"]] if augmenting else []
        names += [e.name for e in val] if restyled else []
        with open_source(cfg.data.path or None) as source:
            strokes = load_strokes(source, "train", names)
    if restyled:
        style = val_alt_render_config(cfg.data)
        assert strokes is not None  # loaded above for the restyled split
        data[VAL_ALT] = [Expression(name=e.name, tokens=e.tokens, image=render_ink(strokes[e.name], style))
                         for e in val]
    if "2014" in test_years and STANDARD_2014 not in test_years:
        standard = data.get(STANDARD_2014) or standard_2014_if_available(data["2014"],
                                                                         RenderConfig.from_data_config(cfg.data))
        if standard is not None:
            data[STANDARD_2014] = standard
            test_years.insert(test_years.index("2014") + 1, STANDARD_2014)
    return strokes if augmenting else None
