"""What both benchmarks share before timing: the `bench.KEY=VALUE` knobs, the `Bench`, the header, and
the synthetic expressions timed without `--data`."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

if TYPE_CHECKING:  # the model library is imported when a benchmark runs, not for `hmer --help`
    from ..model import HMERModel

BENCH_DEFAULTS: dict[str, Any] = {
    "pool": 0, "warmup": -1, "weights": "", "check_unbatched": 0, "start_at": 0.0, "flop_batches": -1,
    "flop_spread": 0, "batches": 0, "share": 1,
}

# CROHME train (8,393 expressions after the validation hold-out, standard renderer): means, standard
# deviations and correlations of log height, log width and log caption length.
_LOG_MEAN = np.array([4.576, 5.500, 2.358])
_LOG_STD = np.array([0.352, 0.761, 0.979])
_LOG_CORR = np.array([[1.0, 0.542, 0.704], [0.542, 1.0, 0.821], [0.704, 0.821, 1.0]])


def synthetic_expressions(n: int, seed: int = 0):
    """Stroke-like images and captions whose (height, width, length) follow CROHME train's joint
    log-normal fit (median about 97 x 245 px, 11 tokens; wider images hold longer captions)."""
    from PIL import Image, ImageDraw

    from ..data import Expression
    from ..data.vocab import CROHME_SYMBOLS

    rng = np.random.default_rng(seed)
    cov = _LOG_CORR * np.outer(_LOG_STD, _LOG_STD)
    logs = rng.multivariate_normal(_LOG_MEAN, cov, size=n)
    out = []
    for i in range(n):
        h = int(np.clip(round(math.exp(logs[i, 0])), 24, 488))
        w = int(np.clip(round(math.exp(logs[i, 1])), 24, 2048))
        length = int(np.clip(round(math.exp(logs[i, 2])), 1, 96))
        img = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(img)
        for _ in range(max(2, w // 25)):
            pts = [(float(rng.uniform(0, w)), float(rng.uniform(0, h))) for _ in range(4)]
            draw.line(pts, fill=255, width=3)
        tokens = [CROHME_SYMBOLS[j] for j in rng.integers(0, len(CROHME_SYMBOLS), length)]
        out.append(Expression(name=f"synthetic_{i}", tokens=tokens, image=np.asarray(img, dtype=np.uint8)))
    return out


def split_overrides(overrides: Sequence[str] | None) -> tuple[list[str], dict[str, Any]]:
    """(config overrides, bench knobs): `bench.KEY=VALUE` items are the benchmark's own."""
    config_items, knobs = [], dict(BENCH_DEFAULTS)
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not key.startswith("bench."):
            config_items.append(item)
            continue
        name = key[len("bench."):].strip()
        if not sep or name not in BENCH_DEFAULTS:
            raise ValueError(f"unknown benchmark setting {item!r}; known: "
                             + ", ".join(f"bench.{k}" for k in BENCH_DEFAULTS))
        knobs[name] = type(BENCH_DEFAULTS[name])(value.strip())
    return config_items, knobs


@dataclass
class Bench:
    """What both benchmarks share."""

    what: str
    preset: str
    cfg: Any
    knobs: dict[str, Any]
    device: torch.device
    amp: torch.dtype | None
    model: HMERModel
    exprs: list
    split: str
    from_data: bool
    images: int
    seconds: float
    out: Any

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"


def prepare(what: str, preset: str, device: str, data: str | None, images: int, seconds: float,
            overrides: list[str] | None, out, config: str | None = None) -> Bench:
    """The config with overrides, device, model (`bench.weights`' or fresh), expressions (a split of
    `data`, else synthetic) and the header lines."""
    from ..config import Config, parse_overrides
    from ..data import load_dataset
    from ..device import autocast_dtype, cpu_description, resolve_device, share_device
    from ..model import build_model
    from ..model_presets import preset_with_recipe
    from ..training.setup import prepare_model

    out = out if out is not None else sys.stdout
    config_items, knobs = split_overrides(overrides)
    base = Config.load(config) if config else preset_with_recipe(preset)
    cfg = base.override(parse_overrides(config_items))
    dev = resolve_device(device)
    share_device(dev, int(knobs["share"]))  # one of N processes side by side (bench.share)
    torch.manual_seed(0)
    if knobs["weights"]:
        from ..tracking.models import load_model

        model, wcfg, _ = load_model(knobs["weights"], device="cpu")
        cfg.model = wcfg.model
        model = model.to(dev)
    else:
        model = build_model(cfg.model).to(dev)
    model = prepare_model(model, cfg.train)
    gpu = dev.type == "cuda"
    if not images:
        images = (4096 if what == "train" else 1000) if gpu else (48 if what == "train" else 8)
    data_path = data or os.environ.get("HMER_DATA")
    split = "train" if what == "train" else "2014"
    if data_path:
        exprs = load_dataset(data_path, cfg.data, splits=(split,))[split]
        source = f"CROHME {split} ({data_path})"
    else:
        exprs = synthetic_expressions(knobs["pool"] or (8393 if what == "train" else 1000))
        source = f"synthetic ({len(exprs)} expressions)"
    bench = Bench(what, preset, cfg, knobs, dev, autocast_dtype(cfg.train.precision, dev), model, exprs, split,
                  bool(data_path), images, seconds, out)
    from ..training.loader import auto_prefetch

    params = sum(p.numel() for p in model.parameters())
    origin = f"config={config}" if config else f"preset={preset}"
    print(f"benchmark={what} {origin} device={dev} precision={bench.amp or torch.float32} "
          f"params={params} source={source}", file=out)
    print(f"processor={cpu_description()!r}", file=out)  # CPU figures differ by core kind
    compiled = bool(cfg.train.compile) and what == "train"
    print(f"weights={knobs['weights'] or 'random'} threads={torch.get_num_threads()} share={knobs['share']} "
          f"compile={compiled} "
          f"prefetch={auto_prefetch(cfg.data.prefetch, dev)} pin_memory={gpu} "
          f"channels_last={bool(cfg.train.channels_last)} conv1x1_as_matmul={bool(cfg.train.conv1x1_as_matmul)}",
          file=out)
    return bench
