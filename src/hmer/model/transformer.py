"""Transformer decoder (BTTR), optionally with CoMER's attention refinement (coverage).

Each layer is PyTorch's nn.TransformerDecoderLayer default, which BTTR uses: post-norm,
ReLU FFN, dropout on the attention weights and on every residual branch:

    x = norm1(x + drop(causal_self_attn(x)))
    x = norm2(x + drop(cross_attn(x, image)))          # CoMER: scores refined by the ARM
    x = norm3(x + drop(linear2(drop(relu(linear1(x))))))

then a linear projection to the vocabulary (no final LayerNorm, as in BTTR's and CoMER's code).

Target padding: targets are right-padded and self-attention is causal, so a real token never
attends to a pad token; training passes no `tgt_pad_mask`, keeping the fast `is_causal` kernels.
Given one, pad keys are masked as in BTTR's and CoMER's decoders (which changes only the logits at
pad positions and of a sequence with a pad inside). CPU training computes the per-token layers on
the real tokens alone (`packs_tokens`, hmer.model.accelerations).

Incremental decoding caches, per layer, the keys/values of every token fed so far (each step
projects only the new token) and, once per image, the keys/values of the image features.
With coverage, the cache also holds each ARM layer's running sum of past attention maps.

CoMER's Attention Refinement Module (ARM; Zhao & Gao, ECCV 2022). Coverage: at decoding step t,
the sum of the cross-attention maps of the steps before t (an *exclusive* cumulative sum over time,
so step t never sees itself or the future).
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

from dataclasses import dataclass, replace
from typing import Optional, Sequence, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..config import ModelConfig
from ..registry import COVERAGES, DECODERS
from .accelerations import Attended, Dropout, PackedTokens, PointwiseConv, packed_forward
from .attention import MultiHeadAttention, Refinement
from .decoder_base import Decoder, DecoderState
from .posenc import TokenEmbedding


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


# ---- the decoder ------------------------------------------------------------------------------

class TransformerDecoderLayer(nn.Module):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout)
        self.cross_attn = MultiHeadAttention(d_model, nhead, dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor, memory_pad: Tensor, tgt_pad_mask: Optional[Tensor] = None,
                refine: Optional[Refinement] = None, need_weights: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        """Teacher forcing: x [N, L, d], memory [B, S, d] -> (x, the cross-attention weights [N, H, L, S])."""
        x = self.norm1(x + self.dropout(self.self_attn(x, key_padding_mask=tgt_pad_mask, causal=True).out))
        out, weights, _ = self.cross_attn(x, memory, memory_pad, refine=refine, need_weights=need_weights)
        return self.feed_forward(self.norm2(x + self.dropout(out))), weights

    def step(self, x: Tensor, self_kv: tuple[Tensor, Tensor], memory_kv: tuple[Tensor, Tensor], memory_pad: Tensor,
             refine: Optional[Refinement], need_weights: bool, need_unrefined: bool) -> tuple[Tensor, Attended]:
        """One token a row, x [N, 1, d], against the keys/values of every token so far (`self_kv`) and
        of the image (`memory_kv`, projected once by `init_state`)."""
        x = self.norm1(x + self.dropout(self.self_attn(x, kv=self_kv).out))
        attended = self.cross_attn(x, key_padding_mask=memory_pad, refine=refine, need_weights=need_weights,
                                   kv=memory_kv, need_unrefined=need_unrefined)
        return self.feed_forward(self.norm2(x + self.dropout(attended.out))), attended

    def feed_forward(self, x: Tensor) -> Tensor:
        y = self.linear2(self.dropout(F.relu(self.linear1(x))))
        return self.norm3(x + self.dropout(y))


@DECODERS.register("transformer")
class TransformerDecoder(Decoder):
    """BTTR's transformer decoder; with a coverage (model.coverage), CoMER's."""

    supports_coverage = True  # the ARM refines its cross-attention (config validation reads this)
    reads_grouped_memory = True  # rows grouped by image read its keys/values once (accelerations.grouped_attention)
    packs_tokens = False  # hmer.model.accelerations

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.embed = TokenEmbedding(cfg)
        # a ModuleList (its layers are submodules), typed by what it holds
        self.layers = cast(Sequence[TransformerDecoderLayer], nn.ModuleList(
            TransformerDecoderLayer(d, cfg.nhead, cfg.dim_feedforward, cfg.dropout)
            for _ in range(cfg.num_decoder_layers)
        ))
        self.coverage_kind: CoverageKind = COVERAGES.get(cfg.coverage)
        self.arm: Optional[AttentionRefinementModule] = None
        if self.coverage_kind.refines:
            in_maps = self.coverage_kind.in_maps(cfg.nhead)
            self.arm = AttentionRefinementModule(cfg.nhead, in_maps, cfg.coverage_channels, cfg.coverage_kernel)
        self.out = nn.Linear(d, cfg.vocab_size)

    # ---- coverage -----------------------------------------------------------------------------
    def _has_arm(self, i: int) -> bool:
        return self.arm is not None and i > 0

    def _needs_weights(self, i: int) -> bool:
        """Layer i's attention feeds layer i+1's cross coverage."""
        return self.coverage_kind.reads_below and i < len(self.layers) - 1

    def _refinement(self, i: int, below: Optional[Tensor], row_mask: Tensor) -> Optional[Refinement]:
        """Layer i's ARM: its term from the coverage of every step, of this layer's unrefined
        attention and `below`, the layer below's refined one."""
        if not self._has_arm(i):
            return None
        arm = self.arm
        assert arm is not None  # _has_arm
        return lambda unrefined: arm(coverage_of_steps(self.coverage_kind, below, unrefined), row_mask)

    # ---- teacher forcing ----------------------------------------------------------------------
    def forward(self, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor] = None,
                return_attention: bool = False):
        if self.packs_tokens and self.training and self.arm is None and not return_attention:
            tokens = PackedTokens.of(tgt_in, tgt_pad_mask)
            if tokens is not None:
                return packed_forward(self, feats, feat_mask, tgt_in, tgt_pad_mask, tokens)
        b, h, w, d = feats.shape
        memory, pad = feats.reshape(b, h * w, d), feat_mask.reshape(b, h * w)
        rows = tgt_in.shape[0]
        row_mask = feat_mask if rows == b else feat_mask.repeat_interleave(rows // b, 0)  # the ARM's, per row
        x = self.embed(tgt_in)
        weights: Optional[Tensor] = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            need = self._needs_weights(i) or (return_attention and i == last)
            x, weights = layer(x, memory, pad, tgt_pad_mask, self._refinement(i, weights, row_mask), need)
        logits = self.out(x)
        if return_attention:
            assert weights is not None  # the last layer's weights were asked for
            return logits, weights.mean(dim=1).view(rows, -1, h, w)
        return logits

    # ---- incremental decoding -----------------------------------------------------------------
    def init_state(self, feats: Tensor, feat_mask: Tensor) -> DecoderState:
        b, h, w, d = feats.shape
        memory_feats = feats.reshape(b, h * w, d)
        memory: dict[str, Tensor] = {"mask": feat_mask}
        cache: dict[str, Tensor] = {}
        nhead, head_dim = self.layers[0].self_attn.nhead, self.layers[0].self_attn.head_dim
        for i, layer in enumerate(self.layers):
            memory[f"k{i}"], memory[f"v{i}"] = layer.cross_attn.project_kv(memory_feats)
            cache[f"self_k{i}"] = feats.new_zeros(b, nhead, 0, head_dim)
            cache[f"self_v{i}"] = feats.new_zeros(b, nhead, 0, head_dim)
            if self._has_arm(i):
                assert self.arm is not None  # _has_arm
                cache[f"cov{i}"] = feats.new_zeros(b, self.arm.conv.in_channels, h * w)
        return DecoderState(t=0, memory=memory, cache=cache)

    def step(self, state: DecoderState, tokens: Tensor) -> tuple[Tensor, DecoderState]:
        n = tokens.shape[0]
        x = self.embed(tokens.reshape(n, 1), start=state.t)
        # Beam search's rows come grouped by image: each image's keys/values are read once per
        # group, never gathered per row (see DecoderState). The ARM's maps stay per row.
        image = state.groups if state.group > 0 else state.rows
        pad = image("mask").flatten(1)
        row_mask = state.rows("mask") if self.arm is not None else None
        cache = dict(state.cache)
        below: Optional[Tensor] = None
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.project_kv(x)
            k = cache[f"self_k{i}"] = torch.cat([cache[f"self_k{i}"], k], dim=2)
            v = cache[f"self_v{i}"] = torch.cat([cache[f"self_v{i}"], v], dim=2)
            refine = None
            if self._has_arm(i):
                # The ARM's term at this step reads the coverage of the steps before it alone.
                assert self.arm is not None  # _has_arm
                term = self.arm(cache[f"cov{i}"][:, None], row_mask)
                refine = lambda unrefined, term=term: term  # noqa: E731
            # (the cache holds only the past and present: no causal mask)
            x, attended = layer.step(x, (k, v), (image(f"k{i}"), image(f"v{i}")), pad, refine,
                                     need_weights=self._needs_weights(i), need_unrefined=self._has_arm(i))
            if self._has_arm(i):  # this step's attention joins the running sum
                assert attended.unrefined is not None  # asked for
                cache[f"cov{i}"] = cache[f"cov{i}"] + torch.cat(self.coverage_kind.maps(below, attended.unrefined),
                                                                 dim=1)[:, :, 0]
            below = attended.weights
        logits = self.out(x[:, 0])
        return logits, replace(state, t=state.t + 1, cache=cache)
