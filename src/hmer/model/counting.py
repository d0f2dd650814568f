"""CAN's symbol counting (Li et al., ECCV 2022, "Counting-Aware Network"), for any decoder (`model.counting`).

The multi-scale counting module (`SymbolCounter`) predicts from the encoded image how many times every
symbol class appears; its counting loss is added to the decoder's loss with weight `train.counting_weight`.
The classes counted are the symbols, not the pad, start and end tokens nor the structure tokens `{ } ^ _`
(CAN's counting labels leave the same out), given by the trainer as `counted` (the model does not know the
vocabulary's strings).

Where the count is read: CAN's GRU adds a linear embedding of the count vector to the sum that feeds
its classifier at every step. `CountingDecoder` does that for every family, `out(x + E c) = out(x) +
W_out E c`: a per-image term of the logits, read by teacher forcing and every search alike (it rides
in the decoding state's per-image memory). For the GRU that is CAN's construction; for the transformer
the same place is the last layer's output (adding the count to the token embeddings would change what
every attention reads, which CAN does not do).

What departs from CAN, and why: the branches read the decoder's memory (the encoder's features
projected to d_model, with their positions), not the DenseNet's raw output: that is what every
decoder family receives, so counting wraps any decoder without reaching into the encoder. The
counts feed the classifier without dropout (CAN's dropout covers the sum). Sizes: CAN's branches are
512 wide on 684 DenseNet channels (12.1M of CAN-DWAP's 16.8M parameters); `hmer models` prints what
`model.counting_channels` gives at each preset's size.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..config import ModelConfig
from .decoder_base import Decoder, DecoderState

COUNT_BIAS = "count_bias"  # DecoderState memory: each image's counting term of the logits [B, V]


class ChannelAttention(nn.Module):
    """Squeeze and excitation over the channels (CAN's `ChannelAtt`)."""

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        hidden = max(1, channels // reduction)
        self.squeeze = nn.Linear(channels, hidden)
        self.excite = nn.Linear(hidden, channels)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """x [B, C, h, w], valid [B, 1, h, w] (1 = a real position)."""
        mean = (x * valid).sum((2, 3)) / valid.sum((2, 3)).clamp_min(1)
        return x * torch.sigmoid(self.excite(F.relu(self.squeeze(mean))))[..., None, None]


class CountingBranch(nn.Module):
    """One scale: a k x k convolution, batch norm, channel attention, a 1x1 convolution to the classes,
    a sigmoid: a density map per class, summed over the real positions."""

    def __init__(self, in_channels: int, channels: int, classes: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, kernel, padding=kernel // 2, bias=False)
        self.norm = nn.BatchNorm2d(channels)
        self.attention = ChannelAttention(channels)
        self.classes = nn.Conv2d(channels, classes, 1, bias=False)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """x [B, d, h, w] (padding zeroed), valid [B, 1, h, w] -> counts [B, classes]."""
        y = self.attention(self.norm(self.conv(x)), valid)
        return (torch.sigmoid(self.classes(y)) * valid).sum((2, 3))


class SymbolCounter(nn.Module):
    """CAN's multi-scale counting module on encoded features [B, h, w, d]."""

    def __init__(self, d_model: int, channels: int, classes: int):
        super().__init__()
        self.branches = nn.ModuleList(CountingBranch(d_model, channels, classes, k) for k in (3, 5))

    def forward(self, feats: Tensor, feat_mask: Tensor) -> tuple[Tensor, list[Tensor]]:
        """feats [B, h, w, d], feat_mask [B, h, w] (True = pad) -> (the mean count [B, V], each branch's)."""
        valid = (~feat_mask)[:, None].to(feats.dtype)
        x = feats.permute(0, 3, 1, 2) * valid
        counts = [branch(x, valid) for branch in self.branches]
        return torch.stack(counts).mean(0), counts


def counting_loss(branches: list[Tensor], mean: Tensor, target: Tensor) -> Tensor:
    """CAN's: smooth L1 of each branch's counts and of their mean against the caption's counts."""
    return sum((F.smooth_l1_loss(c.float(), target) for c in [*branches, mean]), torch.zeros((), device=mean.device))


def caption_counts(tgt_out: Tensor, images: int, counted: Tensor) -> Tensor:
    """The caption's count of each class [B, V] from the target rows (the first `images` rows: one full
    caption each, in whatever direction), the classes that `counted` [V] (bool) leaves out at 0."""
    rows = tgt_out[:images]
    counts = torch.zeros(rows.shape[0], counted.shape[0], device=rows.device)
    counts.scatter_add_(1, rows, torch.ones_like(rows, dtype=counts.dtype))
    return counts * counted.to(counts.dtype)


class CountingDecoder(Decoder):
    """`inner` (the `model.decoder` family's decoder, unchanged) with CAN's counts added to its logits."""

    def __init__(self, inner: Decoder, cfg: ModelConfig):
        super().__init__()
        self.inner = inner
        self.counter = SymbolCounter(cfg.d_model, cfg.counting_channels, cfg.vocab_size)
        self.embed_counts = nn.Linear(cfg.vocab_size, self.classifier.in_features)
        self.reads_grouped_memory = inner.reads_grouped_memory

    @property
    def classifier(self) -> nn.Linear:
        out = getattr(self.inner, "out", None)
        if not isinstance(out, nn.Linear):
            raise TypeError(f"{type(self.inner).__name__} has no linear classifier `out` for the counts to join")
        return out

    def count_term(self, counts: Tensor) -> Tensor:
        """The counts' share of the logits, [B, V]: the classifier's weights on their embedding."""
        return F.linear(self.embed_counts(counts), self.classifier.weight)

    def forward(self, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor] = None,
                return_attention: bool = False):
        term = self.count_term(self.counter(feats, feat_mask)[0])
        out = self.inner(feats, feat_mask, tgt_in, tgt_pad_mask, return_attention=return_attention)
        logits, attention = out if return_attention else (out, None)
        group = tgt_in.shape[0] // feats.shape[0]
        rows = term.repeat_interleave(group, 0) if group > 1 else term  # row r reads image r // group
        logits = logits + rows[:, None].to(logits.dtype)
        return (logits, attention) if return_attention else logits

    def init_state(self, feats: Tensor, feat_mask: Tensor) -> DecoderState:
        state = self.inner.init_state(feats, feat_mask)
        term = self.count_term(self.counter(feats, feat_mask)[0])
        return replace(state, memory={**state.memory, COUNT_BIAS: term})

    def step(self, state: DecoderState, tokens: Tensor) -> tuple[Tensor, DecoderState]:
        logits, state = self.inner.step(state, tokens)
        return logits + state.rows(COUNT_BIAS).to(logits.dtype), state

    def reorder_state(self, state: DecoderState, index: Tensor, group: int = 0) -> DecoderState:
        return self.inner.reorder_state(state, index, group=group)
