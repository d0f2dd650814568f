"""Renderer augmentation: training images redrawn from their strokes with a random pen, blur and
small distortions, so that a model does not learn one renderer's look; and a second rendering style
for validation (`data.val_alt`, `val_alt_render_config`) that scores how much a model cares.

Draws come from a generator seeded by (train.seed, epoch), taken in batch order: reproducible, the
same with or without prefetching, and a resumed run continues the stream. The keys, their order,
costs and why (issue 26): docs/data.md, "Renderer augmentation" and "Choosing without the test years".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageFilter

from ..atomic import write_atomically
from ..config import DataConfig
from .errors import DataError
from .inkml import parse_inkml
from .render import SUPERSAMPLE, RenderConfig, ink_scale, render_ink, to_model_scale

# Pen pressure is drawn at a knot every this many pen points along a stroke (linear between).
_PRESSURE_PIECE = 8


@dataclass(frozen=True)
class AugmentConfig:
    """The `data.aug_*` keys (see the module docstring); `enabled` when any image is redrawn."""

    share: float = 0.0
    width_min: float = 1.0
    width_max: float = 1.0
    pressure: float = 0.0
    antialias: float = 0.0
    downscale: float = 0.0
    blur: float = 0.0
    slant: float = 0.0
    rotate: float = 0.0
    jitter: float = 0.0
    elastic: float = 0.0

    @classmethod
    def from_data_config(cls, data_cfg: DataConfig) -> "AugmentConfig":
        """From the `data.aug_*` key of each field's name (a pen width of 0: 1.0)."""
        keys = {f.name: getattr(data_cfg, f"aug_{f.name}") for f in dataclasses.fields(cls)}
        return cls(**{**keys, "width_min": keys["width_min"] or 1.0, "width_max": keys["width_max"] or 1.0})

    @property
    def enabled(self) -> bool:
        return self.share > 0


def augmented_image(strokes: Sequence[np.ndarray], render_cfg: RenderConfig, aug: AugmentConfig,
                    rng: np.random.Generator) -> np.ndarray:
    """One random redrawing of `strokes` (uint8 [H, W], 255 = ink) for a model trained on
    `render_cfg` renderings; the same number of draws from `rng` whatever is on."""
    u = rng.random(12)  # every draw up front: the stream does not depend on which options are on
    waves = rng.random((2, 2, 3))  # elastic: per axis, two waves of (frequency, phase, direction)
    strokes = [np.asarray(s, dtype=np.float64).reshape(-1, 2) for s in strokes]
    strokes = [s for s in strokes if len(s)]
    points = np.concatenate(strokes)
    centre = (points.min(axis=0) + points.max(axis=0)) / 2

    # 1. slant and rotation about the centre (y points down, as in the images)
    shear = math.tan(math.radians(aug.slant * (2 * u[0] - 1)))
    angle = math.radians(aug.rotate * (2 * u[1] - 1))
    c, s = math.cos(angle), math.sin(angle)
    matrix = np.array([[c, -s], [s, c]]) @ np.array([[1.0, shear], [0.0, 1.0]])
    strokes = [(st - centre) @ matrix.T + centre for st in strokes]

    downscale = u[2] < aug.downscale
    # (drawn at the ink's own scale when downscaling, whatever data.render_style is)
    downscale = downscale or (render_cfg.downscale and render_cfg.resized)
    draw_cfg = dataclasses.replace(render_cfg, antialias=bool(u[3] < aug.antialias),
                                   height=0 if downscale else render_cfg.height,
                                   scale=1.0 if downscale else render_cfg.scale,
                                   downscale=render_cfg.downscale and not downscale)
    scale = ink_scale(strokes, draw_cfg)

    # 2. displacements in pixels of the drawing, converted to device units
    if aug.jitter > 0:
        noise = np.random.default_rng(rng.integers(2**63))
        strokes = [st + noise.normal(0.0, aug.jitter / scale, st.shape) for st in strokes]
    else:
        rng.integers(2**63)  # keep the stream aligned
    if aug.elastic > 0:
        allp = np.concatenate(strokes)
        low, span = allp.min(axis=0), np.maximum(np.ptp(allp, axis=0), 1e-9)
        amplitude = aug.elastic / scale

        def field(st: np.ndarray) -> np.ndarray:
            rel = (st - low) / span  # 0..1 across the ink
            out = np.zeros_like(st)
            for axis in range(2):
                for freq, phase, along in waves[axis]:
                    t = rel[:, 0] if along < 0.5 else rel[:, 1]
                    out[:, axis] += amplitude / 2 * np.sin(2 * np.pi * ((0.5 + 1.5 * freq) * t + phase))
            return out

        strokes = [st + field(st) for st in strokes]

    # 3. the pen: width for the expression, pressure along each stroke
    width = render_cfg.stroke_width * (aug.width_min + (aug.width_max - aug.width_min) * u[4])
    pieces, widths = [], []
    if aug.pressure > 0:
        pressure = np.random.default_rng(rng.integers(2**63))
        factor = SUPERSAMPLE if draw_cfg.antialias else 1  # render_ink's pens are whole pixels of its grid
        for st in strokes:
            # the pressure: random levels at knots every few points, linear between them
            knots = np.arange(0, len(st) + _PRESSURE_PIECE, _PRESSURE_PIECE)
            level = 1.0 + aug.pressure * (2 * pressure.random(len(knots)) - 1)
            pens = np.maximum(1, np.rint(width * factor * np.interp(np.arange(len(st)), knots, level)))
            # one piece per run of the same pen, each overlapping the next by a point
            starts = np.concatenate([[0], np.flatnonzero(pens[1:] != pens[:-1]) + 1])
            for a, b in zip(starts, np.append(starts[1:], len(st))):
                pieces.append(st[a:min(b + 1, len(st))])
                widths.append(float(pens[a]) / factor)
        scale = ink_scale(strokes, draw_cfg)  # after the displacements, as render_ink would take it
        image = render_ink(pieces, draw_cfg, scale=scale, stroke_widths=widths)
    else:
        # one pen: the renderer's own drawing, so options that change nothing redraw the cached image
        rng.integers(2**63)
        image = render_ink(strokes, dataclasses.replace(draw_cfg, stroke_width=width))

    # 4. drawn at the ink's own scale: to the training size as the standard images are
    if downscale:
        image = to_model_scale(image, render_cfg)
    # 5. blur
    sigma = float(aug.blur * u[5])
    if sigma > 0.05:
        image = np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(sigma)), dtype=np.uint8)
    return image


# ---- the second style, for validation --------------------------------------------------------------

VAL_ALT = "val-alt"  # the split name: its final scores are logged as val-alt_final_exprate etc.


def val_alt_render_config(data_cfg: DataConfig) -> RenderConfig:
    """How `data.val_alt` draws validation: the run's renderer settings in that style."""
    return dataclasses.replace(RenderConfig.from_data_config(data_cfg), downscale=data_cfg.val_alt == "standard-like")


# ---- the strokes of a split, parsed once ------------------------------------------------------------

def load_strokes(source, split: str, names: Sequence[str]) -> dict[str, list[np.ndarray]]:
    """{name: [float32 [N, 2] strokes]} of the split's InkML, cached beside the rendered cache. A
    name whose file is not InkML is a `DataError`: only ink can be redrawn."""
    from .cache import cache_dir, cache_key

    path = cache_dir() / f"strokes-{split}-{cache_key(source, split, names, None)}.npz"
    if path.is_file():
        try:
            return _read_strokes(path)
        except (OSError, ValueError, KeyError):
            pass  # unreadable entry: parse again
    out: dict[str, list[np.ndarray]] = {}
    for name in names:
        filename = source.file_for(split, name)
        if filename is None or not filename.lower().endswith(".inkml"):
            raise DataError(f"{source.describe(split, filename or name)}: data.aug_share redraws training images "
                            f"from their strokes, and this expression has no InkML")
        ink = parse_inkml(source.read_bytes(split, filename), source=source.describe(split, filename))
        out[name] = [np.asarray(s, dtype=np.float32).reshape(-1, 2) for s in ink.strokes if len(s)]
    _write_strokes(path, out)
    return out


def _write_strokes(path: Path, strokes: dict[str, list[np.ndarray]]) -> None:
    names = list(strokes)
    counts = np.array([len(strokes[n]) for n in names], dtype=np.int64)
    flat = [s for n in names for s in strokes[n]]
    lengths = np.array([len(s) for s in flat], dtype=np.int64)
    points = np.concatenate(flat).astype(np.float32) if flat else np.zeros((0, 2), np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda f: np.savez_compressed(f, names=np.array(names, dtype=str), counts=counts,
                                                         lengths=lengths, points=points))


def _read_strokes(path: Path) -> dict[str, list[np.ndarray]]:
    with np.load(path, allow_pickle=False) as npz:
        names, counts, lengths, points = npz["names"].tolist(), npz["counts"], npz["lengths"], npz["points"]
    flat = np.split(points, np.cumsum(lengths)[:-1]) if len(lengths) else []
    starts = np.cumsum([0, *counts.tolist()]).tolist()
    return {name: flat[a:b] for name, a, b in zip(names, starts, starts[1:])}
