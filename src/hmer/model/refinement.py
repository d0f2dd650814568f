"""CoMER's Attention Refinement Module (ARM; Zhao & Gao, ECCV 2022).

Coverage: at decoding step t, the sum of the cross-attention maps of the steps before t
(an *exclusive* cumulative sum over time, so step t never sees itself or the future).
The ARM turns coverage into a term subtracted from the pre-softmax cross-attention scores
(see `attention.MultiHeadAttention.attend`):

    coverage [B, L, C_in, h, w]                 C_in = nhead, or 2*nhead for fusion
      -> conv k x k (C_in -> d_c) + bias -> ReLU
      -> conv 1x1 (d_c -> nhead), no bias
      -> masked batch norm over the unpadded positions only
      =  term [B, nhead, L, h*w]

CoMER also zeroes the ReLU's output at image padding; nothing can see it (the 1x1 conv keeps
positions apart, the norm skips padding, the softmax masks padded scores to -inf), so we leave it
out: the same outputs and gradients to the bit, and a pass over the step's largest tensor saved.

Which attention the coverage accumulates (CoMER's `self_coverage` / `cross_coverage`):
  self    this layer's own (unrefined) attention of the earlier steps;
  cross   the previous layer's refined attention of the earlier steps;
  fusion  both, concatenated along channels as [cross, self].
As in CoMER's code, one ARM is shared by all decoder layers, and the first layer has none in any
mode (even for self coverage).

Masked norm, from CoMER's `MaskBatchNorm2d`: a BatchNorm1d over the feature vectors of the
unpadded (batch, step, y, x) positions only, per head channel. CoMER gathers them with a boolean
index (a host sync, a data-dependent shape); we take the same masked mean and (biased) variance as
sums over the mask, running statistics as BatchNorm's. In eval mode it is the usual affine map, so
incremental decoding equals the full pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from ..registry import COVERAGES
from .accelerations import PointwiseConv


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

    def maps(self, below: Optional[Tensor], own: Tensor) -> list[Tensor]:
        """The maps to accumulate, [below, own] (fusion, as CoMER) or the one read, heads as channels."""
        assert below is not None or not self.reads_below  # a layer that reads below has one
        return ([below] if self.reads_below and below is not None else []) + ([own] if self.reads_self else [])


COVERAGES.register("none", CoverageKind(reads_below=False, reads_self=False), description="no coverage (BTTR)")
COVERAGES.register("self", CoverageKind(reads_below=False, reads_self=True),
                   description="CoMER: each layer's own attention of the earlier steps")
COVERAGES.register("cross", CoverageKind(reads_below=True, reads_self=False),
                   description="CoMER: the layer below's refined attention of the earlier steps")
COVERAGES.register("fusion", CoverageKind(reads_below=True, reads_self=True),
                   description="CoMER: both, as [cross, self] (the paper's model)")


class _SumsBefore(torch.autograd.Function):
    """out[:, t] = sum of x[:, s] for s < t (out[:, 0] = 0): an exclusive cumulative sum along dim 1.

    torch's CPU `cumsum` sums in float64 one element at a time, and its backward flips the tensor
    twice (together 5 % of a fusion-coverage training step in `benchmarks/profile_train.py`). Here
    a float64 running sum over the steps is added to one slice at a time: `cumsum`'s values and
    gradients to the bit, forward plus backward in 30-35 ms against 77-79 ms for the shifted
    `cumsum` at the `cpu` budget's sizes (`benchmarks/bench_coverage_ops.py`).
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return _running_sums(x, reverse=False)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return _running_sums(grad, reverse=True)  # x[:, s] reaches every out[:, t] with t > s


def _running_sums(x: Tensor, reverse: bool) -> Tensor:
    """out[:, t] = sum of x[:, s] over s < t (reverse: s > t), accumulated in float64 from the
    nearest end, as `cumsum` accumulates."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    steps = x.shape[1]
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    if steps:
        out[:, order[0]] = 0
        acc = x[:, order[0]].to(torch.float64, copy=True)
        for t in order[1:]:
            out[:, t] = acc
            acc += x[:, t]
    return out


def sums_before(x: Tensor) -> Tensor:
    """The exclusive cumulative sum along dim 1 (the steps): out[:, t] = sum of x[:, s] over s < t."""
    return _SumsBefore.apply(x)


def coverage_of_steps(kind: CoverageKind, below: Optional[Tensor], own: Tensor) -> Tensor:
    """The coverage every step reads, [B, L, C_in, S]: out[:, t] sums the maps of the steps before t
    (`kind.maps`), step-major, so that it is the ARM's convolution input [B * L, C_in, h, w] as it is.

    below / own: attention maps [B, H, L, S], copied once into the step-major layout and summed
    along the steps (`sums_before`)."""
    return sums_before(torch.cat([maps.transpose(1, 2) for maps in kind.maps(below, own)], dim=2))


class MaskedBatchNorm(nn.Module):
    """BatchNorm over channel dim 1 whose statistics use only the positions where `valid` is 1."""

    running_mean: Tensor  # the buffers' types (register_buffer does not declare them)
    running_var: Tensor

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.eps = eps
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: Tensor, valid: Tensor, dim: int = 1) -> Tensor:
        """x [..., C, ...] with the channels in `dim`; valid (1 = image, 0 = padding) broadcasts
        against x with size 1 in `dim` (and may have size 1 where x does not: the positions it
        stands for count that many times)."""
        shape = [1] * x.dim()
        shape[dim] = -1
        others = tuple(d for d in range(x.dim()) if d != dim)
        if self.training:
            xf, vf = x.float(), valid.float()
            # unpadded positions (the same for every channel), counting valid's broadcast
            count = vf.sum() * (x.numel() // x.shape[dim] // vf.numel())
            mean = (xf * vf).sum(dim=others) / count.clamp_min(1)
            var = (((xf - mean.view(shape)) * vf) ** 2).sum(dim=others) / count.clamp_min(1)
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
        self.proj = PointwiseConv(channels, nhead, bias=False)
        self.norm = MaskedBatchNorm(nhead)

    def forward(self, coverage: Tensor, feat_mask: Tensor) -> Tensor:
        """coverage [B, L, C_in, S] (`coverage_of_steps`); feat_mask [B, h, w] (True = pad)."""
        b, length, c, _ = coverage.shape
        h, w = feat_mask.shape[1:]
        x = self.conv(coverage.reshape(b * length, c, h, w))
        x = self.proj(torch.relu_(x)).contiguous()  # the convolutions may answer channels-last
        valid = (~feat_mask)[:, None, None].to(x.dtype)  # [B, 1, 1, h, w], broadcast over the steps
        x = self.norm(x.view(b, length, self.nhead, h, w), valid, dim=2)
        return x.view(b, length, self.nhead, h * w).transpose(1, 2)
