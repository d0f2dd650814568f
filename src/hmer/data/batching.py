"""The unit every later stage works on (`Expression`: one expression's name, caption tokens and
image), bucketed into batches under a pixel budget, and a batch collated into tensors.

Training batches follow BTTR's scheme with a better sort key, (height // 16, width): 16 px is the
encoder's stride, and within a height bin the widths, which vary far more, line up. Evaluation never
drops an expression: an image above `max_image_pixels` is resized down in `collate` and counted in
`Batch.resized`; pass the same limit to `make_batches` so the bucketing sees the resized sizes.
See docs/data.md, "Batching", for the measured padding.

The pad ladder (`PadLadder`) rounds every batch's padded height and width up to a rung, so that a
GPU sees a few shapes instead of one a batch (a new shape costs a step about 0.6 s against 0.06-0.1 s,
and a first pass ran at 7 images/s against 71 once the shapes were seen); the pixel budget applies to
the images' own sizes. `collate` applies it after the scale augmentation; `shapes_under_scale` lists
every shape a batch can take over the augmentation's range, which a planning pass warms up
(hmer.training.planning). See docs/training.md, "Recipes", and docs/benchmarks.md section 5.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np
import torch
from PIL import Image

from .vocab import Vocab


@dataclass(eq=False)  # images are arrays: compare expressions by name when needed, not with ==
class Expression:
    """`image` is uint8 [H, W] with 255 = ink on a 0 background; `tokens` may be empty when the
    expression has no caption (e.g. a file given to `hmer predict`)."""

    name: str
    tokens: list[str]
    image: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.image.shape[0]), int(self.image.shape[1])


@dataclass(frozen=True)
class PadLadder:
    """Rungs: multiples of `multiple`, from `multiple` up, each at least `growth` times the one below."""

    multiple: int = 1
    growth: float = 1.0

    def __post_init__(self) -> None:
        if self.multiple < 1 or not self.growth >= 1.0:
            raise ValueError(f"a pad ladder needs multiple >= 1 and growth >= 1, not {self.multiple}, {self.growth}")

    @classmethod
    def from_data_config(cls, data_cfg) -> "PadLadder":
        return cls(data_cfg.pad_multiple, data_cfg.pad_growth)

    @property
    def enabled(self) -> bool:
        """False when every size is its own rung (no padding beyond the batch's largest image)."""
        return self.multiple > 1 or self.growth > 1.0

    def rung(self, size: int) -> int:
        """The smallest rung >= `size` (`size` itself when the ladder is off)."""
        if self.growth == 1.0:
            return -(-size // self.multiple) * self.multiple
        rungs = _rungs(self.multiple, self.growth, size)
        return rungs[bisect.bisect_left(rungs, size)]

    def rungs_up_to(self, size: int) -> list[int]:
        """Every rung up to the first one >= `size`."""
        if self.growth == 1.0:
            return list(range(self.multiple, self.rung(size) + 1, self.multiple))
        rungs = _rungs(self.multiple, self.growth, size)
        return list(rungs[: bisect.bisect_left(rungs, size) + 1])


@lru_cache(maxsize=64)
def _rungs(multiple: int, growth: float, at_least: int) -> tuple[int, ...]:
    # grown in powers of two of the asked size, so the cache holds a few tuples per ladder
    top = 1 << max(0, int(at_least) - 1).bit_length()
    rungs = [multiple]
    while rungs[-1] < top:
        below = rungs[-1]
        rungs.append(max(below + multiple, -(-math.ceil(below * growth - 1e-9) // multiple) * multiple))
    return tuple(rungs)


NO_LADDER = PadLadder()


def scaled_size(size: int, scale: float | None) -> int:
    """An image side after the scale augmentation, as `collate` resizes it."""
    return size if scale is None or scale == 1.0 else max(1, round(size * scale))


def shapes_under_scale(images: int, height: int, width: int, ladder: PadLadder,
                       scale_range: tuple[float, float] | None = None) -> set[tuple[int, int, int]]:
    """Every (images, padded height, padded width) `collate` can give a batch whose largest image is
    `height` x `width`, for any scale in `scale_range` (None: no augmentation). round(side * s) is
    monotone in s, so the shape changes only where it crosses a rung: probing the range's ends and
    between every two such scales finds them all."""
    if scale_range is None or scale_range[1] <= 0:
        return {(images, ladder.rung(height), ladder.rung(width))}
    low, high = scale_range
    cuts = {low, high}
    for side in (height, width):
        for rung in ladder.rungs_up_to(scaled_size(side, high) + 1):
            s = (rung + 0.5) / side  # round(side * s) > rung from here on
            if low < s < high:
                cuts.add(s)
    ordered = sorted(cuts)
    probes = ordered + [(a + b) / 2 for a, b in zip(ordered, ordered[1:])]
    return {(images, ladder.rung(scaled_size(height, s)), ladder.rung(scaled_size(width, s))) for s in probes}


def ladder_shapes(batch_sizes: Iterable[tuple[int, int, int]], ladder: PadLadder,
                  scale_range: tuple[float, float] | None = None) -> set[tuple[int, int, int]]:
    """The union of `shapes_under_scale` over batches given as (images, largest height, largest width)."""
    shapes: set[tuple[int, int, int]] = set()
    for n, h, w in batch_sizes:
        shapes |= shapes_under_scale(n, h, w, ladder, scale_range)
    return shapes



@dataclass
class Batch:
    """A collated batch. Masks are True at padding."""

    names: list[str]
    images: torch.Tensor  # float32 [B, 1, H, W] in [0, 1], white ink on black, zero padded
    image_mask: torch.Tensor  # bool [B, H, W]
    token_ids: list[list[int]]  # without sos / eos
    resized: int = 0  # images shrunk to fit max_pixels

    def __len__(self) -> int:
        return len(self.names)

    def to(self, device: torch.device | str, non_blocking: bool = True) -> "Batch":
        return replace(self, images=self.images.to(device, non_blocking=non_blocking),
                       image_mask=self.image_mask.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """Page-locked copies, so a later `.to(cuda, non_blocking=True)` overlaps with compute."""
        return replace(self, images=self.images.pin_memory(), image_mask=self.image_mask.pin_memory())


def fit_to_pixels(height: int, width: int, max_pixels: int | None) -> tuple[int, int]:
    """(H, W) shrunk, keeping the aspect, so that H * W <= max_pixels (unchanged if it fits)."""
    if not max_pixels or max_pixels <= 0 or height * width <= max_pixels:
        return height, width
    factor = math.sqrt(max_pixels / (height * width))
    new_h = max(1, int(height * factor))
    new_w = max(1, min(int(width * factor), max_pixels // new_h))  # a 1-px-high sliver still fits
    return new_h, new_w


HEIGHT_BIN = 16  # px; the encoder's stride (see the module docstring)


def make_batches(exprs: Sequence[Expression], pixel_budget: int, max_batch_size: int, shuffle: bool = True,
                 seed: int = 0, max_image_pixels: int | None = None,
                 height_bin: int = HEIGHT_BIN) -> list[list[int]]:
    """Indices into `exprs`, one list per batch. `max_batch_size` <= 0: no cap; `height_bin=1`
    sorts by exact (height, width), as BTTR."""
    sizes = [fit_to_pixels(e.image.shape[0], e.image.shape[1], max_image_pixels) for e in exprs]
    bin_ = max(1, height_bin)
    order = sorted(range(len(exprs)), key=lambda i: (sizes[i][0] // bin_, sizes[i][1], sizes[i][0], i))
    cap = max_batch_size if max_batch_size > 0 else len(exprs) + 1
    batches: list[list[int]] = []
    current: list[int] = []
    max_h = max_w = 0
    for i in order:
        h, w = sizes[i]
        grown_h, grown_w = max(max_h, h), max(max_w, w)
        if current and (len(current) >= cap or (len(current) + 1) * grown_h * grown_w > pixel_budget):
            batches.append(current)
            current, grown_h, grown_w = [], h, w
        current.append(i)
        max_h, max_w = grown_h, grown_w
    if current:
        batches.append(current)
    if shuffle:
        order_of_batches = np.random.default_rng(seed).permutation(len(batches))
        batches = [batches[j] for j in order_of_batches]
    return batches


def _batch_sizes(exprs: Sequence[Expression], batches: Sequence[Sequence[int]], max_image_pixels: int | None,
                 scales: Sequence[float] | None) -> list[list[tuple[int, int]]]:
    """Each batch's image sizes as `collate` sees them: after any evaluation resize, then the batch's
    scale augmentation (`scales`, one per batch; None: none)."""
    out = []
    for k, idx in enumerate(batches):
        scale = scales[k] if scales is not None else None
        fitted = (fit_to_pixels(exprs[i].image.shape[0], exprs[i].image.shape[1], max_image_pixels) for i in idx)
        out.append([(scaled_size(h, scale), scaled_size(w, scale)) for h, w in fitted])
    return out


def _padded_shape(sizes: Sequence[tuple[int, int]], ladder: PadLadder) -> tuple[int, int, int]:
    return len(sizes), ladder.rung(max(h for h, _ in sizes)), ladder.rung(max(w for _, w in sizes))


def padded_shapes(exprs: Sequence[Expression], batches: Sequence[Sequence[int]],
                  max_image_pixels: int | None = None, ladder: PadLadder = NO_LADDER,
                  scales: Sequence[float] | None = None) -> list[tuple[int, int, int]]:
    """(images, height, width) of each batch as `collate` pads it; `scales`: each batch's scale
    augmentation (None: none). With neither ladder nor scales: each batch's largest sizes."""
    return [_padded_shape(sizes, ladder) for sizes in _batch_sizes(exprs, batches, max_image_pixels, scales)]


def padding_share(exprs: Sequence[Expression], batches: Sequence[Sequence[int]],
                  max_image_pixels: int | None = None, ladder: PadLadder = NO_LADDER,
                  scales: Sequence[float] | None = None) -> float:
    """Padded pixels / all pixels of the padded batches (`scales`: as in `padded_shapes`)."""
    sizes = _batch_sizes(exprs, batches, max_image_pixels, scales)
    total = sum(n * height * width for n, height, width in (_padded_shape(s, ladder) for s in sizes))
    real = sum(h * w for batch in sizes for h, w in batch)
    return 1.0 - real / total if total else 0.0


def resize_image(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of a uint8 [H, W] image (PIL, so deterministic)."""
    if image.shape[:2] == (height, width):
        return image
    return np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BILINEAR), dtype=np.uint8)


def collate(exprs: Sequence[Expression], vocab: Vocab, scale: float | None = None,
            max_pixels: int | None = None, ladder: PadLadder = NO_LADDER) -> Batch:
    """Stack expressions into a `Batch`, zero padded at the bottom and right. `scale` (train-time
    augmentation) resizes every image; `max_pixels` (evaluation) shrinks any image above it and counts
    it; `ladder` pads the batch's height and width up to its rungs, after the scaling."""
    if not exprs:
        raise ValueError("collate needs at least one expression")
    images = []
    resized = 0
    for e in exprs:
        image = e.image
        if scale is not None and scale != 1.0:
            h, w = image.shape[:2]
            image = resize_image(image, scaled_size(h, scale), scaled_size(w, scale))
        fitted = fit_to_pixels(image.shape[0], image.shape[1], max_pixels)
        if fitted != image.shape[:2]:
            image = resize_image(image, *fitted)
            resized += 1
        images.append(image)
    height = ladder.rung(max(im.shape[0] for im in images))
    width = ladder.rung(max(im.shape[1] for im in images))
    pixels = np.zeros((len(images), height, width), dtype=np.uint8)
    mask = np.ones((len(images), height, width), dtype=bool)
    for i, im in enumerate(images):
        pixels[i, : im.shape[0], : im.shape[1]] = im
        mask[i, : im.shape[0], : im.shape[1]] = False
    tensor = torch.from_numpy(pixels).unsqueeze(1).float().div_(255.0)
    token_ids = [vocab.encode(e.tokens, source=e.name) for e in exprs]
    return Batch(names=[e.name for e in exprs], images=tensor, image_mask=torch.from_numpy(mask),
                 token_ids=token_ids, resized=resized)
