"""1x1 convolutions that can run as matrix products: the DenseNet-B bottlenecks and transitions,
the projection of the features to d_model, and the projection of CoMER's ARM.

Why. On a GPU, cuDNN's v8 API builds an execution plan on the host for every convolution at every
new input shape (forward, and both passes of backward), and the leases measured a step at about
0.6 s for a new batch shape against 0.06-0.1 s for a seen one (docs/benchmarks.md section 5). Half
of BTTR's 100 convolutions are 1x1. A 1x1 convolution with stride 1 is a matrix product over the
channels: on the channels-last layout the feature map [B, C, H, W] is already a [B*H*W, C] matrix,
so `F.linear` computes it through cuBLAS, which needs no per-shape plan.

`PointwiseConv` is an `nn.Conv2d` (the same parameters, names and initialisation), so every
checkpoint, reference import and golden test reads it as before; `as_matmul` only chooses how its
forward computes (`train.conv1x1_as_matmul`, `use_matmul`). The two differ by float rounding (the
products are summed in another order): on a CPU, oneDNN's 1x1 path is a single gemm already
(docs/benchmarks.md), so the choice is for the GPU.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class PointwiseConv(nn.Conv2d):
    """A 1x1, stride-1, ungrouped convolution; with `as_matmul` its forward is `F.linear` over the
    channels of the NHWC view (module docstring)."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size=1, bias=bias)
        self.as_matmul = False

    def forward(self, x: Tensor) -> Tensor:
        if not self.as_matmul:
            return super().forward(x)
        # [B, C, H, W] -> [B, H, W, C] (a view, contiguous when x is channels-last) -> linear -> back;
        # the result is channels-last, as cuDNN's answer to a channels-last input is
        y = F.linear(x.permute(0, 2, 3, 1), self.weight.flatten(1), self.bias)
        return y.permute(0, 3, 1, 2)


def use_matmul(model: nn.Module, on: bool = True) -> int:
    """Set how every `PointwiseConv` of `model` computes (`on`: as a matrix product); returns how
    many there are. The parameters are untouched."""
    convs = [m for m in model.modules() if isinstance(m, PointwiseConv)]
    for conv in convs:
        conv.as_matmul = on
    return len(convs)
