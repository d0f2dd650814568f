"""DenseNet-B image encoder (DenseWAP / BTTR / CoMER), with padding masks carried through every stride.

Layout, as in BTTR's and CoMER's `encoder.py` (which fix the parameter count of the papers):

    stem   7x7 conv, stride 2, 2*growth channels -> BN -> ReLU -> 2x2 max-pool
    block  `num_layers` bottleneck layers, each
               1x1 conv to 4*growth -> BN -> ReLU -> dropout
               3x3 conv to growth   -> BN -> ReLU -> dropout,  concatenated to its input
    trans  1x1 conv (channels * compression) -> BN -> ReLU -> dropout -> 2x2 average pool
    ...    blocks and transitions alternate; the last block has no transition
    final  BN (BTTR's and CoMER's `post_norm`)

The reference code's layer is conv-BN-ReLU, not the DenseNet paper's BN-ReLU-conv; we follow the
code, which the published numbers (and parameter counts) come from. Total stride: 4 (stem) * 2 per
transition, 16 with three blocks.

Padding. Images are zero-padded at the bottom and right. For a padded image to give exactly the
features of the same image on a tight canvas (in eval mode), every spatial operation must see at
padded positions what it would see beyond the tight canvas's border:
  * 3x3 convolutions: zeros, so every 3x3 conv's input is multiplied by the valid mask
    (after BN/ReLU, padded positions are not zero any more);
  * max-pool after ReLU: zeros are fine (ReLU output >= 0);
  * average pool: on a tight canvas a window straddling the border averages only its valid
    pixels (`ceil_mode`), so we pool `x * valid` and divide by the pooled valid fraction.
The mask is downsampled by taking every second row/column (BTTR's `mask[:, 0::2, 0::2]`):
an output position is valid iff the first pixel of its window is, which for bottom/right
padding is the same as "its window holds a valid pixel" and matches the ceil-mode sizes.
BatchNorm in training mode still sees padded positions in its batch statistics, as in
BTTR; in eval mode it is pointwise, so the invariance holds exactly (up to float error).

`mask_padding=False` is the references' encoder: no masking at all (plain ceil-mode pools,
3x3 convs that see whatever BN/ReLU made of the zero padding). Only the mask is downsampled.
A single image (no padding) gets the same features either way; a padded one does not.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..config import ModelConfig
from .accelerations import Dropout, PointwiseConv, free_to_read


def downsample_mask(mask: Tensor) -> Tensor:
    """Padding mask [B, H, W] (True = pad) -> [B, ceil(H/2), ceil(W/2)], matching a stride-2, ceil-mode op."""
    return mask[:, 0::2, 0::2]


class BottleneckLayer(nn.Module):
    """1x1 conv (4*growth) -> BN -> ReLU -> 3x3 conv (growth) -> BN -> ReLU; output concatenated to the input."""

    def __init__(self, in_channels: int, growth_rate: int, dropout: float):
        super().__init__()
        inner = 4 * growth_rate
        self.conv1 = PointwiseConv(in_channels, inner, bias=False)
        self.norm1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, growth_rate, kernel_size=3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(growth_rate)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, valid: Optional[Tensor]) -> Tensor:
        y = self.dropout(F.relu(self.norm1(self.conv1(x))))
        if valid is not None:  # the 3x3 conv must see zeros at padding, as at a tight canvas's border
            y = y * valid
        y = self.dropout(F.relu(self.norm2(self.conv2(y))))
        return torch.cat([x, y], dim=1)


class SingleLayer(nn.Module):
    """DenseNet without bottleneck (`bottleneck=False`): 3x3 conv (growth) -> BN -> ReLU, concatenated."""

    def __init__(self, in_channels: int, growth_rate: int, dropout: float):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, growth_rate, kernel_size=3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(growth_rate)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, valid: Optional[Tensor]) -> Tensor:
        y = self.dropout(F.relu(self.norm(self.conv(x if valid is None else x * valid))))
        return torch.cat([x, y], dim=1)


class DenseBlock(nn.Module):
    def __init__(self, in_channels: int, num_layers: int, growth_rate: int, bottleneck: bool, dropout: float):
        super().__init__()
        layer = BottleneckLayer if bottleneck else SingleLayer
        self.layers = nn.ModuleList(
            layer(in_channels + i * growth_rate, growth_rate, dropout) for i in range(num_layers)
        )
        self.out_channels = in_channels + num_layers * growth_rate

    def forward(self, x: Tensor, valid: Optional[Tensor]) -> Tensor:
        for layer in self.layers:
            x = layer(x, valid)
        return x


class Transition(nn.Module):
    """1x1 conv (compression) -> BN -> ReLU -> dropout -> masked 2x2 average pool (plain one if valid is None)."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float):
        super().__init__()
        self.conv = PointwiseConv(in_channels, out_channels, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, valid: Optional[Tensor]) -> Tensor:
        x = self.dropout(F.relu(self.norm(self.conv(x))))
        if valid is None:
            return F.avg_pool2d(x, 2, ceil_mode=True)
        # the average over each window's valid pixels: both pools share a divisor, so their ratio is
        # sum(x * valid) / count(valid)
        return F.avg_pool2d(x * valid, 2, ceil_mode=True) / F.avg_pool2d(valid, 2, ceil_mode=True).clamp_min(1e-6)


class DenseNetB(nn.Module):
    """Images [B, 1, H, W] + mask [B, H, W] -> features [B, C, h, w] + mask [B, h, w] (True = pad)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        growth, num_blocks, dropout = cfg.growth_rate, cfg.num_dense_blocks, cfg.encoder_dropout
        self.mask_padding = cfg.mask_padding
        channels = 2 * growth
        self.stem_conv = nn.Conv2d(1, channels, kernel_size=7, stride=2, padding=3, bias=False)
        self.stem_norm = nn.BatchNorm2d(channels)
        self.blocks = nn.ModuleList()
        self.transitions = nn.ModuleList()
        for i in range(num_blocks):
            block = DenseBlock(channels, cfg.num_dense_layers, growth, cfg.bottleneck, dropout)
            self.blocks.append(block)
            channels = block.out_channels
            if i < num_blocks - 1:
                out = int(math.floor(channels * cfg.compression))
                self.transitions.append(Transition(channels, out, dropout))
                channels = out
        self.final_norm = nn.BatchNorm2d(channels)
        self.out_channels = channels
        self.stride = 4 * 2 ** (num_blocks - 1)

    def forward(self, images: Tensor, image_mask: Tensor) -> tuple[Tensor, Tensor]:
        x = self.stem_conv(images)
        mask = downsample_mask(image_mask)
        x = F.relu(self.stem_norm(x))
        # A batch without padding (common: batches are grouped by size) needs no masking at all,
        # which saves a multiply of every feature map, where reading the mask is free.
        masking = self.mask_padding and (not free_to_read(mask) or bool(mask.any()))
        if masking:
            # Zero the padding before the max-pool: ReLU output >= 0, so zeros never win over image pixels.
            x = x * (~mask).unsqueeze(1).to(x.dtype)
        x = F.max_pool2d(x, 2, ceil_mode=True)
        mask = downsample_mask(mask)
        for i, block in enumerate(self.blocks):
            valid = (~mask).unsqueeze(1).to(x.dtype) if masking else None
            x = block(x, valid)
            if i < len(self.transitions):
                x = self.transitions[i](x, valid)
                mask = downsample_mask(mask)
        return self.final_norm(x), mask.contiguous()
