"""The unit every later stage works on: one expression's name, caption tokens and image."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
