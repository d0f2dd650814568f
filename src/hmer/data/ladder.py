"""The ladder of padded batch sizes: every batch's height and width rounded up to one of a few sizes,
so that a GPU sees a few input shapes instead of one a batch.

Why: cuDNN plans every convolution at every new shape, and torch.compile and CUDA graphs need static
shapes; the leases measured a training step at about 0.6 s for a new shape against 0.06-0.1 s for a
seen one (docs/benchmarks.md section 5). Scale augmentation makes every batch's shape new each epoch.

The rungs (`data.pad_multiple` = m, `data.pad_growth` = g): multiples of m from m up, each at least
g times the one below; g = 1 is every multiple of m, m = g = 1 no ladder. A geometric ladder pads a
wide batch by at most a fixed share: on CROHME train at the reference batch setting, m = 16 and
g = 1.25 make 176 shapes at 24.4 % padding against 188 at 30.9 % for multiples of 64
(`python benchmarks/bench_data.py`).

`collate` applies the ladder after the scale augmentation. `shapes_under_scale` lists every shape a
batch can take over the augmentation's range, which a planning pass warms up (hmer.training.planning).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable


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
