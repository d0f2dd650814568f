"""CoMER's Attention Refinement Module (ARM; Zhao & Gao, ECCV 2022).

Coverage: at decoding step t, the sum of the cross-attention maps of the steps before t
(an *exclusive* cumulative sum over time, so step t never sees itself or the future).
The ARM turns coverage into a term subtracted from the pre-softmax cross-attention scores
(see `attention.MultiHeadAttention.attend`):

    coverage [B, C_in, L, h, w]                 C_in = nhead, or 2*nhead for fusion
      -> conv k x k (C_in -> d_c) + bias -> ReLU -> zero at image padding
      -> conv 1x1 (d_c -> nhead), no bias
      -> masked batch norm over the unpadded positions only
      =  term [B, nhead, L, h*w]

Which attention the coverage accumulates (CoMER's `self_coverage` / `cross_coverage`):
  self    this layer's own (unrefined) attention of the earlier steps;
  cross   the previous layer's refined attention of the earlier steps;
  fusion  both, concatenated along channels as [cross, self].
As in CoMER's code, one ARM module is shared by all decoder layers, and the first layer has
no ARM in any mode (it has no previous layer; CoMER applies the ARM from layer 2 on even for
self coverage, and we follow the reference).

Masked norm, from CoMER's `MaskBatchNorm2d`: a BatchNorm1d over the feature vectors of the
unpadded (batch, step, y, x) positions only, per head channel. CoMER gathers them with a
boolean index (a host sync and a data-dependent shape); we compute the same masked mean and
(biased) variance with sums over the mask, and update the running statistics with the unbiased
variance and momentum 0.1, as BatchNorm does. In eval mode it is the usual affine map with the
running statistics, so incremental decoding (one step at a time) equals the full pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..registry import COVERAGES


@dataclass(frozen=True)
class CoverageKind:
    """Which attention maps the ARM sums (`model.coverage`): this layer's own (`reads_self`), the
    layer below's refined ones (`reads_below`), both, or none (no ARM at all)."""

    reads_below: bool
    reads_self: bool

    @property
    def refines(self) -> bool:
        return self.reads_below or self.reads_self

    def in_maps(self, nhead: int) -> int:
        """Channels of the coverage the ARM reads: nhead per attention it sums."""
        return nhead * (int(self.reads_below) + int(self.reads_self))

    def maps(self, below: Optional[Tensor], own: Tensor) -> Tensor:
        """The maps to accumulate, heads as channels [*, C_in, ...]: [below, own] (fusion, as CoMER)."""
        parts = ([below] if self.reads_below else []) + ([own] if self.reads_self else [])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


COVERAGES.register("none", CoverageKind(reads_below=False, reads_self=False), description="no coverage (BTTR)")
COVERAGES.register("self", CoverageKind(reads_below=False, reads_self=True),
                   description="CoMER: each layer's own attention of the earlier steps")
COVERAGES.register("cross", CoverageKind(reads_below=True, reads_self=False),
                   description="CoMER: the layer below's refined attention of the earlier steps")
COVERAGES.register("fusion", CoverageKind(reads_below=True, reads_self=True),
                   description="CoMER: both, as [cross, self] (the paper's model)")


def exclusive_cumsum(x: Tensor, dim: int) -> Tensor:
    """cumsum shifted by one along `dim`: out[t] = sum_{s < t} x[s], out[0] = 0."""
    out = x.cumsum(dim)
    zero = torch.zeros_like(out.narrow(dim, 0, 1))
    return torch.cat([zero, out.narrow(dim, 0, x.shape[dim] - 1)], dim=dim)


class MaskedBatchNorm(nn.Module):
    """BatchNorm over channel dim 1 whose statistics use only the positions where `valid` is 1."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.eps = eps
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """x [N, C, H, W]; valid [N, 1, H, W] (1 = image, 0 = padding)."""
        shape = (1, -1, 1, 1)
        if self.training:
            xf, vf = x.float(), valid.float()
            count = vf.sum()  # unpadded positions (the same for every channel)
            mean = (xf * vf).sum(dim=(0, 2, 3)) / count.clamp_min(1)
            var = (((xf - mean.view(shape)) * vf) ** 2).sum(dim=(0, 2, 3)) / count.clamp_min(1)
            with torch.no_grad():
                unbiased = var * (count / (count - 1).clamp_min(1))
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        scale = self.weight.float() * torch.rsqrt(var.float() + self.eps)
        shift = self.bias.float() - mean.float() * scale
        return (x.float() * scale.view(shape) + shift.view(shape)).to(x.dtype)


class AttentionRefinementModule(nn.Module):
    """coverage [B, C_in, L, S] (S = h*w, exclusive sums of past attention) -> term [B, nhead, L, S]."""

    def __init__(self, nhead: int, in_maps: int, channels: int = 32, kernel_size: int = 5):
        super().__init__()
        self.nhead = nhead
        self.conv = nn.Conv2d(in_maps, channels, kernel_size, padding=kernel_size // 2)
        self.proj = nn.Conv2d(channels, nhead, kernel_size=1, bias=False)
        self.norm = MaskedBatchNorm(nhead)

    def forward(self, coverage: Tensor, feat_mask: Tensor) -> Tensor:
        """coverage [B, C_in, L, S]; feat_mask [B, h, w] (True = pad)."""
        b, c, length, _ = coverage.shape
        h, w = feat_mask.shape[1:]
        maps = coverage.permute(0, 2, 1, 3).reshape(b * length, c, h, w)
        pad = feat_mask[:, None, None].expand(b, length, 1, h, w).reshape(b * length, 1, h, w)
        x = F.relu(self.conv(maps)).masked_fill(pad, 0.0)
        x = self.norm(self.proj(x), (~pad).to(x.dtype))
        return x.view(b, length, self.nhead, h * w).permute(0, 2, 1, 3)
