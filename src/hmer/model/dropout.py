"""Dropout whose random masks cost about what the multiply they gate costs, on a CPU.

torch's CPU dropout draws one Bernoulli variable per element (`aten::bernoulli_`): a mask for
a 1.5M-element feature map takes 8-15 ms against 0.4 ms for the multiply, and dropout cost a
third of every training step of the `small` model (issue 24's profile). Here a mask is drawn
as 64-bit random integers from torch's own generator, one draw per four elements, each read
as four 16-bit uniforms: an element is kept when its 16 bits are at or above p * 2^16.

The masks have Bernoulli's distribution with p rounded to a multiple of 2^-16 (an error below
1e-5), and the kept elements are scaled by 1 / (1 - that p), so the expectation is exact.
The numbers come from torch's default generator: `torch.manual_seed` and the RNG state that
checkpoints keep (hmer.checkpoint) govern them as they governed `bernoulli_`. The stream
itself differs, so one run's single numbers change, not its behaviour over seeds.

`keep_mask` can also fold a second 0/1 mask into the dropout mask (the encoder's padding mask,
which multiplies the same feature map): one multiply of the feature map instead of two.

On other devices torch's own dropout is already fast and is used as it is.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

_LEVELS = 1 << 16  # 16-bit uniforms


def kept_fraction(p: float) -> float:
    """1 - p as the masks realise it (p rounded to a multiple of 2^-16)."""
    return (_LEVELS - round(p * _LEVELS)) / _LEVELS


def keep_mask(x: Tensor, p: float, also: Optional[Tensor] = None) -> Tensor:
    """A dropout mask shaped and typed like `x`: 0 with probability p, else 1 / (1 - p).

    `also` (0/1, broadcastable to x) is multiplied in: positions where it is 0 are always 0.
    """
    dropped = round(p * _LEVELS)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    lanes = words.view(torch.int16)[:n].view(x.shape)  # uniform over [-2^15, 2^15)
    # the comparison writes 0/1 straight into x's dtype: no bool or uint8 mask to convert afterwards
    # (20-40 % of the mask's time on a 6M-element feature map)
    mask = torch.ge(lanes, dropped - _LEVELS // 2, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))
    mask.mul_(1.0 / kept_fraction(p))
    return mask if also is None else mask.mul_(also)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """`F.dropout(x, p, training)` with the cheap masks on a CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    return x * keep_mask(x, p)


def dropout_and_mask(x: Tensor, p: float, training: bool, valid: Optional[Tensor]) -> Tensor:
    """`dropout(x, p, training) * valid` (valid: 0/1, broadcastable, or None) in one multiply on a CPU."""
    if valid is None:
        return dropout(x, p, training)
    if not training or p == 0.0 or x.device.type != "cpu" or p >= 1.0:
        return dropout(x, p, training) * valid
    return x * keep_mask(x, p, also=valid)


class Dropout(nn.Dropout):
    """`nn.Dropout` with the cheap CPU masks (same `p`, same state dict: none)."""

    def forward(self, x: Tensor, valid: Optional[Tensor] = None) -> Tensor:
        return dropout_and_mask(x, self.p, self.training, valid)
