"""Pen strokes -> an 8-bit grey image, white ink (255) on black (0), in the style of the standard
CROHME offline images (the WAP authors' renderings that WAP/BTTR/CoMER papers score on).

Each expression is scaled so that the mean height of its tall strokes (taller than
`tall_stroke_fraction` of its tallest) is `stroke_height` px, the number the standard images hold
constant; an expression of flat strokes only (a lone `-`) is scaled by stroke width instead. Strokes
are a 1-px centre line grown by a 3x3 max filter. Deterministic: the same strokes and settings give
the same bytes, at any coordinate scale. The measurements behind both: docs/data.md, "Rendering".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

from ..config import DataConfig
from .inkml import Ink

# Bump when a change to this module changes any rendered pixel: it is part of the cache key.
RENDERER_VERSION = 1

SUPERSAMPLE = 4  # anti-aliased mode draws at this multiple, then averages each block
# A pixel of a white-on-black image brighter than this is ink: where a 1-bit copy of a rendering
# (`hmer data render --format png`) puts a set bit, and what `hmer predict` looks for in an image.
INK_LEVEL = 127


@dataclass(frozen=True)
class RenderConfig:
    """How strokes become pixels. The defaults reproduce the standard 2014 images' look and size."""

    stroke_height: float = 28.5  # px: mean height of the expression's tall strokes
    tall_stroke_fraction: float = 0.1  # a stroke counts as tall above this fraction of the tallest
    height: int = 0  # > 0: scale every image to exactly this height instead (width follows)
    # With height 0: the image at this multiple of the ink's own scale (1.0: the standard images'
    # size, tall strokes 28.5 px high), so that a symbol has one size across expressions.
    scale: float = 1.0
    stroke_width: float = 3.0  # px
    padding: int = 11  # blank px between the ink and each image edge
    max_height: int = 512  # px; a taller expression is scaled down to fit (keeping aspect)
    max_width: int = 2048  # px; likewise
    antialias: bool = False
    # With height > 0 or scale != 1: draw at the ink's own scale (stroke_height), then scale the
    # image to `height` (or by `scale`) with bilinear filtering: the standard images' way to a model
    # trained at that size (thinner, grey strokes; docs/data.md measures it). data.render_style=standard-like.
    downscale: bool = False

    @classmethod
    def from_data_config(cls, data_cfg: DataConfig) -> "RenderConfig":
        """From `DataConfig.render_height`, `.render_scale` and `.stroke_width`, where 0 means the default."""
        default = cls()
        return dataclasses.replace(default, height=int(data_cfg.render_height),
                                   scale=float(data_cfg.render_scale) or default.scale,
                                   stroke_width=float(data_cfg.stroke_width) or default.stroke_width,
                                   downscale=data_cfg.render_style == "standard-like")

    @property
    def resized(self) -> bool:
        """Whether images reach the model at another size than the ink's own scale draws them."""
        return self.height > 0 or self.scale != 1.0

    def key(self) -> dict[str, object]:
        """Everything that decides the pixels, for cache keys (`downscale` only when on and `scale`
        only when not 1, so that the entries rendered before they existed keep their keys)."""
        fields = dataclasses.asdict(self)
        if not self.downscale:
            del fields["downscale"]
        if self.scale == 1.0:
            del fields["scale"]
        return {"renderer_version": RENDERER_VERSION, **fields}


def render_ink(ink: Ink | Sequence[np.ndarray], cfg: RenderConfig | None = None, *,
               scale: float | None = None, stroke_widths: Sequence[float] | None = None) -> np.ndarray:
    """Render an `Ink` (or [N, 2] stroke arrays) to uint8 [H, W], 255 = ink. For augmentation:
    `scale` (px per device unit) replaces the size normalisation (the clamps still apply), and
    `stroke_widths` gives each stroke its own pen (drawn directly, without the 3x3 brush)."""
    cfg = cfg or RenderConfig()
    if cfg.downscale and cfg.resized:
        drawn = render_ink(ink, dataclasses.replace(cfg, height=0, scale=1.0, downscale=False), scale=scale,
                           stroke_widths=stroke_widths)
        return to_model_scale(drawn, cfg)
    strokes = [np.asarray(s, dtype=np.float64).reshape(-1, 2) for s in (ink.strokes if isinstance(ink, Ink) else ink)]
    if stroke_widths is not None:
        if len(stroke_widths) != len(strokes):
            raise ValueError(f"{len(stroke_widths)} stroke widths for {len(strokes)} strokes")
        widths = [float(w) for w, s in zip(stroke_widths, strokes) if len(s)]
    strokes = [s for s in strokes if len(s)]
    if not strokes:
        source = ink.source if isinstance(ink, Ink) else "strokes"
        raise ValueError(f"{source}: nothing to render (no points)")

    points = np.concatenate(strokes)
    low = points.min(axis=0)
    extent = points.max(axis=0) - low  # (width, height) in device units
    scale = ink_scale(strokes, cfg) if scale is None else float(scale)

    width_px = max(1.0, cfg.stroke_width if stroke_widths is None else max(widths))
    # Room for the pen itself around the centre line, then the blank margin.
    border = cfg.padding + (width_px - 1) / 2
    limit_w = cfg.max_width - 2 * border - 1
    limit_h = cfg.max_height - 2 * border - 1
    if extent[0] * scale > limit_w or extent[1] * scale > limit_h:
        scale = min(limit_w / extent[0] if extent[0] > 0 else math.inf,
                    limit_h / extent[1] if extent[1] > 0 else math.inf)
    out_w = int(_snap(extent[0] * scale + 2 * border)) + 1
    out_h = int(_snap(extent[1] * scale + 2 * border)) + 1

    factor = SUPERSAMPLE if cfg.antialias else 1
    pen = max(1, int(round(width_px * factor)))
    # PIL's wide lines leave 1-2 px thin spots on diagonals; the standard images have none (a 3x3
    # brush). So in binary mode draw the line 2 px thinner and grow it with a 3x3 max filter.
    grow = not cfg.antialias and pen >= 3 and stroke_widths is None
    pens = [pen - 2 if grow else pen] * len(strokes) if stroke_widths is None else \
        [max(1, int(round(max(1.0, w) * factor))) for w in widths]
    size = (out_w * factor, out_h * factor)
    offset = border * factor + (factor - 1) / 2  # pixel centres of the fine grid
    paths = _paths(strokes, (low, scale * factor, offset))
    if stroke_widths is not None:
        pixels = _brushed(paths, pens, size)
        if factor > 1:
            pixels = np.asarray(Image.fromarray(pixels).reduce(factor), dtype=np.uint8)
        return pixels
    canvas = Image.new("L", size, 0)
    draw = ImageDraw.Draw(canvas)
    for coords, line_width in zip(paths, pens):
        if len(coords) > 1:
            draw.line(coords, fill=255, width=line_width, joint="curve" if line_width > 2 else None)
        # Round pen tips at both ends (and a dot for a single-point stroke).
        if line_width > 2:
            radius = (line_width - 1) / 2
            for x, y in (coords[0], coords[-1]):
                draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=255)
        elif len(coords) == 1:  # a dot as wide as the pen
            x, y = coords[0]
            draw.rectangle((x - (line_width - 1) // 2, y - (line_width - 1) // 2,
                            x + line_width // 2, y + line_width // 2), fill=255)
    if factor > 1:
        canvas = canvas.reduce(factor)
    pixels = np.asarray(canvas, dtype=np.uint8)
    return _grow_square(pixels, 3) if grow else pixels.copy()


def _paths(strokes: list[np.ndarray], transform: tuple[np.ndarray, float, float]) -> list[list[tuple[int, int]]]:
    """Each stroke's points on the pixel grid, without consecutive repeats (pens sample faster than
    they move). All strokes at once: augmentation draws hundreds of short pieces per image."""
    low, scale, offset = transform
    lengths = [len(s) for s in strokes]
    xy = _snap((np.concatenate(strokes) - low) * scale + offset).astype(np.int64)
    starts = np.cumsum([0] + lengths[:-1])
    keep = np.ones(len(xy), dtype=bool)
    keep[1:] = np.any(xy[1:] != xy[:-1], axis=1)
    keep[starts] = True
    kept_per_stroke = np.add.reduceat(keep, starts) if len(strokes) else np.array([], dtype=np.int64)
    points = [tuple(p) for p in xy[keep].tolist()]
    ends = np.cumsum(kept_per_stroke).tolist()
    return [points[a:b] for a, b in zip([0, *ends], ends)]


def _brushed(paths: list[list[tuple[int, int]]], pens: list[int], size: tuple[int, int]) -> np.ndarray:
    """Each path dragged with a square brush as wide as its pen: per pen, the 1-px centre lines grown
    by the brush, the layers overlaid; ten times cheaper than PIL's wide lines with round caps."""
    out = np.zeros(size[::-1], dtype=np.uint8)
    for pen in sorted(set(pens)):
        layer = Image.new("L", size, 0)
        draw = ImageDraw.Draw(layer)
        for coords, p in zip(paths, pens):
            if p != pen:
                continue
            if len(coords) > 1:
                draw.line(coords, fill=255, width=1)
            else:
                draw.point(coords, fill=255)
        np.maximum(out, _grow_square(np.asarray(layer, dtype=np.uint8), pen), out=out)
    return out


def _grow_square(pixels: np.ndarray, pen: int) -> np.ndarray:
    """Dilation by a pen x pen square, centred (the extra row and column of an even pen below and
    right), as two separable maxima: ~40x faster than PIL's MaxFilter."""
    low, high = (pen - 1) // 2, pen // 2
    for axis in (0, 1):
        source = np.moveaxis(pixels, axis, 0)
        grown = source.copy(order="K")
        for shift in range(1, high + 1):  # ink spreads down / right
            np.maximum(grown[shift:], source[:-shift], out=grown[shift:])
        for shift in range(1, low + 1):  # and up / left
            np.maximum(grown[:-shift], source[shift:], out=grown[:-shift])
        pixels = np.moveaxis(grown, 0, axis)
    return pixels


def to_model_scale(image: np.ndarray, cfg: RenderConfig) -> np.ndarray:
    """An image drawn at the ink's own scale (a standard image, a `standard-like` drawing) at the size
    a model trained on `cfg` renderings reads: scaled to `cfg.height` keeping its aspect, else by
    `cfg.scale` (at least 1 x 1 px), bilinear."""
    height, width = image.shape[:2]
    if cfg.height > 0:
        if height == cfg.height:
            return image
        size = (max(1, round(width * cfg.height / height)), cfg.height)
    elif cfg.scale == 1.0:
        return image
    else:
        size = (max(1, round(width * cfg.scale)), max(1, round(height * cfg.scale)))
    return np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR), dtype=np.uint8)


def _snap(values: np.ndarray | float) -> np.ndarray:
    """Round to whole pixels, first dropping noise below 1e-6 px, so that the same ink at another
    coordinate scale (x1000, x0.001) does not flip the values that sit at .5."""
    return np.rint(np.round(values, 6))


def ink_scale(strokes: Sequence[np.ndarray], cfg: RenderConfig | None = None) -> float:
    """Pixels per device unit that `render_ink` would use before size clamping."""
    cfg = cfg or RenderConfig()
    strokes = [np.asarray(s, dtype=np.float64).reshape(-1, 2) for s in strokes if len(s)]
    points = np.concatenate(strokes)
    extent = points.max(axis=0) - points.min(axis=0)
    width_px = max(1.0, cfg.stroke_width)
    if cfg.height > 0:
        room = cfg.height - 2 * (cfg.padding + (width_px - 1) / 2) - 1
        if extent[1] > 0 and room > 0:
            return room / float(extent[1])
    heights = np.array([np.ptp(s[:, 1]) for s in strokes])
    if heights.max() <= 0:
        # Only flat strokes (a lone minus sign): fall back to their lengths.
        heights = np.array([np.ptp(s[:, 0]) for s in strokes])
        if heights.max() <= 0:
            return 1.0  # a single dot: any scale draws the same pen tip
    # "Taller than", with a relative tolerance so that a stroke sitting exactly at the threshold
    # is treated the same at every coordinate scale (x1000 must not flip it through rounding).
    tall = heights[heights > cfg.tall_stroke_fraction * heights.max() * (1 + 1e-6)]
    reference = float(tall.mean()) if tall.size else float(heights.max())
    return cfg.stroke_height * cfg.scale / reference
