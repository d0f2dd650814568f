"""The accelerations: the same model computed faster for training, beside the plain path.

The plain path computes what BTTR's and CoMER's code compute, with torch's kernels. Training switches
these on for its device (`accelerate`, from `training.setup.prepare_model`); each gives the plain
path's numbers up to float rounding (tests/test_model_choices.py, tests/test_reference_fidelity.py):

- **cheap dropout masks** (a CPU): torch's CPU dropout draws a Bernoulli variable per element
  (`bernoulli_`): 8-15 ms for a 1.5M-element feature map against 0.4 ms for the multiply it gates, a
  third of a `small` training step (issue 24). `keep_mask` reads each 64-bit integer from torch's
  generator as four 16-bit uniforms: Bernoulli's distribution with p rounded to a multiple of 2^-16,
  the kept elements scaled by 1 / (1 - that p), governed by `torch.manual_seed` and the checkpoints'
  RNG state as `bernoulli_` was (another stream). Attention then takes its explicit path.
- **packed tokens** (a CPU, no ARM): at the `cpu` budget half of a batch's target positions are
  padding; `PackedTokens` computes the transformer's per-token layers on the real tokens alone.
- **grouped memory**: a `bi` batch's l2r and r2l rows of an image attend to it as one block of
  queries (`grouped_directions`, `grouped_attention`): its keys/values are projected once, not once
  per direction (the largest matrix product of `bi` training). Beam search and joint search's
  rescoring ask for that layout themselves (`DecoderState.group`, `HMERModel.decode(group=)`).
- **the GRU's coverage convolution as a matrix product** (a CPU, with gradients): 2.3 against 3.0 ms
  a token forward and backward at the `cpu` budget's sizes (`benchmarks/bench_coverage_ops.py`).
- **1x1 convolutions as matrix products** (`train.conv1x1_as_matmul`): cuDNN plans every
  convolution at every new input shape (about 0.6 s a new batch shape against 0.06-0.1 s a seen one,
  docs/benchmarks.md section 5); `F.linear` over the NHWC view needs no plan.

A module that takes one declares its switch as a class attribute, off on the plain path (`SWITCHES`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .decoder_base import PAD_ID

# The switches `accelerate` sets, and the modules that declare them.
SWITCHES = (
    "cheap_masks",  # Dropout: the masks of `keep_mask`
    "packs_tokens",  # TransformerDecoder: PackedTokens
    "groups_directions",  # HMERModel: a bi batch's rows of one image attend as one block
    "coverage_as_matmul",  # rnn.CoverageAttention: its convolution as a matrix product
    "as_matmul",  # PointwiseConv: F.linear
)


def accelerate(model: nn.Module, device: Optional[torch.device], conv1x1_as_matmul: bool = False) -> None:
    """Switch on the accelerations for training `model` on `device` (module docstring); `device`
    None switches every one off: the plain path."""
    cpu = device is not None and device.type == "cpu"
    on = {"cheap_masks": cpu, "packs_tokens": cpu, "coverage_as_matmul": cpu, "groups_directions": device is not None,
          "as_matmul": device is not None and conv1x1_as_matmul}
    for module in model.modules():
        for name in SWITCHES:
            if hasattr(module, name):
                setattr(module, name, on[name])


def free_to_read(x: Tensor) -> bool:
    """Whether the host reads `x`'s values without waiting for a device: on a CPU, a batch without
    padding can skip its masking; on a GPU, asking would stop the host until the GPU caught up."""
    return x.device.type == "cpu"


# ---- cheap dropout masks ---------------------------------------------------------------------

_LEVELS = 1 << 16  # 16-bit uniforms


def kept_fraction(p: float) -> float:
    """1 - p as the masks realise it (p rounded to a multiple of 2^-16)."""
    return (_LEVELS - round(p * _LEVELS)) / _LEVELS


def keep_mask(x: Tensor, p: float) -> Tensor:
    """A dropout mask shaped and typed like `x`: 0 with probability p, else 1 / (1 - p)."""
    dropped = round(p * _LEVELS)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    lanes = words.view(torch.int16)[:n].view(x.shape)  # uniform over [-2^15, 2^15)
    # the comparison writes 0/1 straight into x's dtype: no bool or uint8 mask to convert afterwards
    # (20-40 % of the mask's time on a 6M-element feature map)
    mask = torch.ge(lanes, dropped - _LEVELS // 2, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))
    return mask.mul_(1.0 / kept_fraction(p))


class Dropout(nn.Dropout):
    """`nn.Dropout`, whose masks come from `keep_mask` with `cheap_masks` (same `p`, no state)."""

    cheap_masks = False

    def forward(self, x: Tensor) -> Tensor:
        if self.cheap_masks and self.training and 0.0 < self.p < 1.0:
            return x * keep_mask(x, self.p)
        return super().forward(x)


# ---- 1x1 convolutions as matrix products -----------------------------------------------------

class PointwiseConv(nn.Conv2d):
    """A 1x1, stride-1, ungrouped convolution; with `as_matmul`, `F.linear` over the channels of the
    NHWC view (the same products, summed in another order)."""

    as_matmul = False

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size=1, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if not self.as_matmul:
            return super().forward(x)
        # [B, C, H, W] -> [B, H, W, C] (a view, contiguous when x is channels-last) -> linear -> back;
        # the result is channels-last, as cuDNN's answer to a channels-last input is
        return F.linear(x.permute(0, 2, 3, 1), self.weight.flatten(1), self.bias).permute(0, 3, 1, 2)


def use_matmul(model: nn.Module, on: bool = True) -> int:
    """Set `as_matmul` of every `PointwiseConv` of `model` alone; returns how many there are."""
    convs = [m for m in model.modules() if isinstance(m, PointwiseConv)]
    for conv in convs:
        conv.as_matmul = on
    return len(convs)


def same_conv_as_matmul(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """`conv(x)` (k x k, stride 1, padding k // 2, no bias) as [N, H*W, C_out]: a matrix product of
    its k x k neighbourhoods (`unfold`)."""
    k = conv.kernel_size[0]
    neighbourhoods = F.unfold(x, k, padding=k // 2)  # [N, C_in*k*k, S]
    return neighbourhoods.transpose(1, 2) @ conv.weight.reshape(conv.out_channels, -1).t()


# ---- grouped memory --------------------------------------------------------------------------

class Attended(NamedTuple):
    """What `MultiHeadAttention` answers: the output, and the attention maps [N, H, L, S] when
    asked: `weights` (what the values were averaged with) and `unrefined` (the softmax of the plain
    scores, what a refinement read)."""

    out: Tensor
    weights: Optional[Tensor] = None
    unrefined: Optional[Tensor] = None


def grouped_attention(attn: Any, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                      refine: Optional[Callable[[Tensor], Tensor]], need_weights: bool,
                      need_unrefined: bool) -> Attended:
    """`attn.attend` (a MultiHeadAttention) for rows in contiguous groups of g that share an image:
    q [N, L, d], k/v [N / g, H, S, dh]. Each image is attended once, by all its group's positions as
    one block of queries (cross-attention never mixes queries), so its keys/values are neither
    projected nor copied per row. A refinement still reads and answers each row's own maps, and the
    maps come back per row; laying them out so is a copy of the step's largest tensor, made only
    when they are asked for."""
    n, length, d = q.shape
    group = n // k.shape[0]

    def rows(maps: Tensor) -> Tensor:  # [N / g, H, g * L, S] -> [N, H, L, S]
        return maps.unflatten(2, (group, length)).transpose(1, 2).reshape(n, attn.nhead, length, -1)

    def groups(maps: Tensor) -> Tensor:  # the inverse
        return maps.unflatten(0, (n // group, group)).transpose(1, 2).flatten(2, 3)

    by_rows = None if refine is None else (lambda weights: groups(refine(rows(weights))))
    out, weights, unrefined = attn.attend(q.view(n // group, group * length, d), k, v, key_padding_mask,
                                          refine=by_rows, need_weights=need_weights, need_unrefined=need_unrefined)
    return Attended(out.reshape(n, length, d), rows(weights) if need_weights and weights is not None else None,
                    rows(unrefined) if need_unrefined and unrefined is not None else None)


def grouped_directions(decoder: nn.Module, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor,
                       tgt_pad_mask: Optional[Tensor], blocks: int) -> Tensor:
    """`decoder`'s teacher forcing of k direction blocks [k * B, L] (l2r rows, then r2l rows) on the
    images' features [B, ...], as groups of each image's k rows: logits [k * B, L, V], in block order."""
    def image_major(rows: Tensor) -> Tensor:  # [k * B, ...] -> [B * k, ...]
        return rows.unflatten(0, (blocks, -1)).transpose(0, 1).flatten(0, 1)

    pad_rows = None if tgt_pad_mask is None else image_major(tgt_pad_mask)
    logits = decoder(feats, feat_mask, image_major(tgt_in), pad_rows)
    return logits.unflatten(0, (-1, blocks)).transpose(0, 1).flatten(0, 1)


# ---- packed tokens ---------------------------------------------------------------------------

class PackedTokens:
    """The real tokens of right-padded rows [B, L] packed into one [N, ...] tensor.

    Every per-token layer (projections, feed-forward, norms, dropout, the output layer) computes the
    N real tokens alone; attention unpacks its queries, keys and values to [B, L, ...] (zeros at
    padding, which a real token never reads: the causal mask or `tgt_pad_mask` hides pad keys). The
    real tokens' values are the padded computation's; only the pad positions' logits differ (0
    instead of values nothing reads)."""

    def __init__(self, real: Tensor):
        self.rows, self.length = real.shape
        self.index = real.flatten().nonzero().squeeze(1)

    @staticmethod
    def of(tgt_in: Tensor, tgt_pad_mask: Optional[Tensor]) -> Optional[PackedTokens]:
        """The packing of a batch's targets, None when they hold no padding."""
        real = tgt_in != PAD_ID if tgt_pad_mask is None else ~tgt_pad_mask
        return None if bool(real.all()) else PackedTokens(real)

    def pack(self, x: Tensor) -> Tensor:
        """[B, L, ...] -> [N, ...]"""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """[N, ...] -> [B, L, ...], zeros at padding"""
        full = x.new_zeros(self.rows * self.length, *x.shape[1:])
        return full.index_copy(0, self.index, x).unflatten(0, (self.rows, self.length))


def packed_forward(decoder: Any, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor],
                   tokens: PackedTokens) -> Tensor:
    """A `TransformerDecoder`'s teacher forcing without an ARM (its forward, layer by layer) on the
    real tokens alone: logits [B', L, V], 0 at padding."""
    b, h, w, d = feats.shape
    memory, pad = feats.reshape(b, h * w, d), feat_mask.reshape(b, h * w)
    x = tokens.pack(decoder.embed(tgt_in))
    for layer in decoder.layers:
        attn = layer.self_attn
        k, v = attn.kv_heads(tokens.unpack(attn.kv_proj(x)))
        out = attn.attend(tokens.unpack(attn.q_proj(x)), k, v, tgt_pad_mask, causal=True).out
        x = layer.norm1(x + layer.dropout(attn.out_proj(tokens.pack(out))))
        attn = layer.cross_attn
        k, v = attn.project_kv(memory)
        out = attn.attend(tokens.unpack(attn.q_proj(x)), k, v, pad).out
        x = layer.norm2(x + layer.dropout(attn.out_proj(tokens.pack(out))))
        x = layer.feed_forward(x)
    return tokens.unpack(decoder.out(x))
