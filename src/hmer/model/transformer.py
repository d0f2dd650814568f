"""Transformer decoder (BTTR), optionally with CoMER's attention refinement (coverage).

Each layer is PyTorch's nn.TransformerDecoderLayer default, which BTTR uses: post-norm,
ReLU FFN, dropout on the attention weights and on every residual branch:

    x = norm1(x + drop(causal_self_attn(x)))
    x = norm2(x + drop(cross_attn(x, image)))          # CoMER: scores refined by the ARM
    x = norm3(x + drop(linear2(drop(relu(linear1(x))))))

then a linear projection to the vocabulary (no final LayerNorm, as in BTTR's and CoMER's code).

Target padding: targets are right-padded and self-attention is causal, so a real token never
attends to a pad token; training therefore passes no `tgt_pad_mask` (the loss ignores pad
positions), which keeps self-attention on the fast `is_causal` kernels. Given one, pad keys are
masked as in BTTR's and CoMER's decoders: that only changes the logits at pad positions, and
those of a sequence with a pad token inside (which the references' searches can produce).
Training on a CPU computes the per-token layers on the real tokens alone (`PackedTokens`): at
the `cpu` budget half of a batch's target positions are padding.

Incremental decoding caches, per layer, the keys/values of every token fed so far (each step
projects only the new token) and, once per image, the keys/values of the image features.
With coverage, the cache also holds each ARM layer's running sum of past attention maps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..config import ModelConfig
from ..registry import COVERAGES, DECODERS
from .attention import MultiHeadAttention, Refinement
from .decoder_base import Decoder, DecoderState
from .direction import special_ids
from .dropout import Dropout
from .embedding import TokenEmbedding
from .refinement import AttentionRefinementModule, CoverageKind, coverage_of_steps


class PackedTokens:
    """The real tokens of right-padded rows [B, L] packed into one [N, ...] tensor.

    Training targets are about half padding at the `cpu` budget (a batch pads every caption to its
    longest), and every per-token layer (projections, feed-forward, norms, dropout, the output
    layer) would compute those positions only for the loss to ignore them. Packed, they compute the
    N real tokens alone; attention unpacks its queries, keys and values to [B, L, ...] (zeros at
    padding, which a real token never reads: the causal mask or `tgt_pad_mask` hides pad keys).
    The real tokens' values are the padded computation's; only the pad positions' logits differ
    (0 instead of values nothing reads)."""

    def __init__(self, real: Tensor):
        self.rows, self.length = real.shape
        self.index = real.flatten().nonzero().squeeze(1)

    def pack(self, x: Tensor) -> Tensor:
        """[B, L, ...] -> [N, ...]"""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """[N, ...] -> [B, L, ...], zeros at padding"""
        full = x.new_zeros(self.rows * self.length, *x.shape[1:])
        return full.index_copy(0, self.index, x).unflatten(0, (self.rows, self.length))


def _unpacked(tokens: Optional[PackedTokens], x: Tensor) -> Tensor:
    return x if tokens is None else tokens.unpack(x)


def _packed(tokens: Optional[PackedTokens], x: Tensor) -> Tensor:
    return x if tokens is None else tokens.pack(x)


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

    # x is [B, L, d], or the real tokens [N, d] when `tokens` packs them (PackedTokens).
    def self_block(self, x: Tensor, k: Tensor, v: Tensor, causal: bool, pad: Optional[Tensor] = None,
                   tokens: Optional[PackedTokens] = None) -> Tensor:
        attn = self.self_attn
        out, _ = attn.attend(attn.split_heads(_unpacked(tokens, attn.q_proj(x))), k, v, pad, causal=causal)
        return self.norm1(x + self.dropout(attn.out_proj(_packed(tokens, out))))

    def cross_block(
        self, x: Tensor, k: Tensor, v: Tensor, pad: Tensor, refine: Optional[Refinement], need_weights: bool,
        tokens: Optional[PackedTokens] = None,
    ) -> tuple[Tensor, Optional[Tensor]]:
        attn = self.cross_attn
        q = attn.split_heads(_unpacked(tokens, attn.q_proj(x)))
        out, weights = attn.attend(q, k, v, pad, refine=refine, need_weights=need_weights)
        return self.norm2(x + self.dropout(attn.out_proj(_packed(tokens, out)))), weights

    def cross_block_grouped(
        self, x: Tensor, k: Tensor, v: Tensor, pad: Tensor, group: int, refine: Optional[Refinement] = None,
        need_weights: bool = False, tokens: Optional[PackedTokens] = None,
    ) -> tuple[Tensor, Optional[Tensor]]:
        """cross_block for rows in contiguous groups of `group` that share an image: x [N, L, d],
        k/v [N // group, H, S, dh], pad [N // group, S]. Each image is attended once, by all its
        group's positions as one block of queries (cross-attention never mixes queries), so its
        keys/values are neither projected nor copied per row. The ARM (`refine`) still reads and
        answers each row's own maps, and the weights come back per row: [N, H, L, S]."""
        attn = self.cross_attn
        q = _unpacked(tokens, attn.q_proj(x))
        n, length, d = q.shape
        q = q.view(n // group, group * length, attn.nhead, attn.head_dim).transpose(1, 2)

        def rows(maps: Tensor) -> Tensor:  # [N // group, H, group * L, S] -> [N, H, L, S]
            return maps.unflatten(2, (group, length)).transpose(1, 2).reshape(n, attn.nhead, length, -1)

        def groups(maps: Tensor) -> Tensor:  # the inverse
            return maps.unflatten(0, (n // group, group)).transpose(1, 2).flatten(2, 3)

        by_rows = None if refine is None else (lambda weights: groups(refine(rows(weights))))
        out, weights = attn.attend(q, k, v, pad, refine=by_rows, need_weights=need_weights)
        out = attn.out_proj(_packed(tokens, out.reshape(n, length, d)))
        # The explicit path (CPU training with dropout) computes weights whether asked or not: laying
        # them out per row is a copy of the step's largest tensor, made only when they are wanted.
        return self.norm2(x + self.dropout(out)), rows(weights) if need_weights and weights is not None else None

    def ff_block(self, x: Tensor) -> Tensor:
        y = self.linear2(self.dropout(F.relu(self.linear1(x))))
        return self.norm3(x + self.dropout(y))


@DECODERS.register("transformer")
class TransformerDecoder(Decoder):
    """BTTR's transformer decoder; with a coverage (model.coverage), CoMER's."""

    supports_coverage = True  # the ARM refines its cross-attention (config validation reads this)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.embed = TokenEmbedding(cfg.vocab_size, d, cfg.token_pos, cfg.max_len, norm=cfg.embed_norm,
                                    pos_norm=cfg.embed_pos_norm)
        # a ModuleList (its layers are submodules), typed by what it holds
        self.layers = cast(Sequence[TransformerDecoderLayer], nn.ModuleList(
            TransformerDecoderLayer(d, cfg.nhead, cfg.dim_feedforward, cfg.dropout)
            for _ in range(cfg.num_decoder_layers)
        ))
        self.coverage = cfg.coverage
        self.coverage_kind: CoverageKind = COVERAGES.get(cfg.coverage)
        self.arm: Optional[AttentionRefinementModule] = None
        if self.coverage_kind.refines:
            in_maps = self.coverage_kind.in_maps(cfg.nhead)
            self.arm = AttentionRefinementModule(cfg.nhead, in_maps, cfg.coverage_channels, cfg.coverage_kernel)
        self.out = nn.Linear(d, cfg.vocab_size)

    # ---- coverage -----------------------------------------------------------------------------
    def _has_arm(self, i: int) -> bool:
        return self.arm is not None and i > 0

    # Rows grouped by image read its keys/values once (`cross_block_grouped`), with coverage too.
    reads_grouped_memory = True

    def _needs_weights(self, i: int) -> bool:
        """Layer i's attention feeds layer i+1's cross coverage."""
        return self.coverage_kind.reads_below and i < len(self.layers) - 1

    def _coverage_maps(self, prev: Optional[Tensor], curr: Tensor) -> Tensor:
        """The attention maps coverage accumulates, heads as channels: [*, C_in, L, S]."""
        return self.coverage_kind.maps(prev, curr)

    # ---- teacher forcing ----------------------------------------------------------------------
    def forward(
        self,
        feats: Tensor,
        feat_mask: Tensor,
        tgt_in: Tensor,
        tgt_pad_mask: Optional[Tensor] = None,
        return_attention: bool = False,
        group: int = 0,
    ):
        if group and return_attention:
            feats, feat_mask, group = feats.repeat_interleave(group, 0), feat_mask.repeat_interleave(group, 0), 0
        b, h, w, d = feats.shape
        memory = feats.reshape(b, h * w, d)
        pad = feat_mask.reshape(b, h * w)
        row_mask = feat_mask.repeat_interleave(group, 0) if group and self.arm is not None else feat_mask
        tokens = self._packing(tgt_in, tgt_pad_mask)
        x = _packed(tokens, self.embed(tgt_in))
        prev: Optional[Tensor] = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv_heads(_unpacked(tokens, layer.self_attn.kv_proj(x)))
            x = layer.self_block(x, k, v, causal=True, pad=tgt_pad_mask, tokens=tokens)
            refine = None
            if self._has_arm(i):
                # curr: this layer's unrefined attention, all steps; prev: the layer below's refined one.
                def refine(curr: Tensor, prev: Optional[Tensor] = prev) -> Tensor:
                    assert self.arm is not None  # _has_arm
                    return self.arm(coverage_of_steps(self.coverage_kind, prev, curr), row_mask)
            mk, mv = layer.cross_attn.project_kv(memory)
            need = self._needs_weights(i) or (return_attention and i == last)
            if group:
                x, prev = layer.cross_block_grouped(x, mk, mv, pad, group, refine, need, tokens)
            else:
                x, prev = layer.cross_block(x, mk, mv, pad, refine, need, tokens)
            x = layer.ff_block(x)
        logits = _unpacked(tokens, self.out(x))
        if return_attention:
            assert prev is not None  # the last layer's weights were asked for
            return logits, prev.mean(dim=1).view(b, -1, h, w)
        return logits

    def _packing(self, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor]) -> Optional[PackedTokens]:
        """PackedTokens for training on a CPU when the rows hold padding, else None. Evaluation keeps
        the padded layout, so that rescoring's sums stay those of the shapes it always had, and a GPU
        keeps it too: counting the real tokens would stop the host until the GPU catches up. So does
        CoMER's ARM: its batch norm takes its statistics over every step of the batch, padding steps
        included (as CoMER's does), so their attention maps must stay what they were."""
        if not self.training or tgt_in.device.type != "cpu" or self.arm is not None:
            return None
        real = tgt_in != special_ids()[0] if tgt_pad_mask is None else ~tgt_pad_mask
        return None if bool(real.all()) else PackedTokens(real)

    # ---- incremental decoding -----------------------------------------------------------------
    def init_state(self, feats: Tensor, feat_mask: Tensor) -> DecoderState:
        b, h, w, d = feats.shape
        memory_feats = feats.reshape(b, h * w, d)
        memory: dict[str, Tensor] = {"mask": feat_mask}
        for i, layer in enumerate(self.layers):
            memory[f"k{i}"], memory[f"v{i}"] = layer.cross_attn.project_kv(memory_feats)
        cache: dict[str, Tensor] = {}
        nhead, head_dim = self.layers[0].self_attn.nhead, self.layers[0].self_attn.head_dim
        for i in range(len(self.layers)):
            cache[f"self_k{i}"] = feats.new_zeros(b, nhead, 0, head_dim)
            cache[f"self_v{i}"] = feats.new_zeros(b, nhead, 0, head_dim)
            if self._has_arm(i):
                assert self.arm is not None  # _has_arm
                in_maps = self.arm.conv.in_channels
                cache[f"cov{i}"] = feats.new_zeros(b, in_maps, h * w)
        return DecoderState(t=0, memory=memory, cache=cache)

    def step(self, state: DecoderState, tokens: Tensor) -> tuple[Tensor, DecoderState]:
        n = tokens.shape[0]
        x = self.embed(tokens.reshape(n, 1), start=state.t)
        # Beam search's rows come grouped by image: each image's keys/values are read once per
        # group, never gathered per row (see DecoderState). The ARM's maps stay per row.
        grouped = state.group > 0
        pad = (state.groups("mask") if grouped else state.rows("mask")).flatten(1)
        row_mask = state.rows("mask") if self.arm is not None else None
        cache = dict(state.cache)
        prev: Optional[Tensor] = None
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.project_kv(x)
            k = torch.cat([cache[f"self_k{i}"], k], dim=2)
            v = torch.cat([cache[f"self_v{i}"], v], dim=2)
            cache[f"self_k{i}"], cache[f"self_v{i}"] = k, v
            x = layer.self_block(x, k, v, causal=False)  # the cache holds only the past and present
            refine = None
            seen: dict[str, Tensor] = {}
            if self._has_arm(i):
                # The ARM reads the coverage of the steps before this one; this step's attention
                # (captured in `seen` by the callback) joins the running sum afterwards.
                coverage = cache[f"cov{i}"]

                def refine(curr: Tensor, coverage: Tensor = coverage, seen: dict = seen) -> Tensor:
                    assert self.arm is not None  # _has_arm
                    seen["curr"] = curr
                    return self.arm(coverage[:, None], row_mask)
            need = self._needs_weights(i)
            if grouped:
                x, weights = layer.cross_block_grouped(x, state.groups(f"k{i}"), state.groups(f"v{i}"), pad,
                                                       state.group, refine, need)
            else:
                x, weights = layer.cross_block(x, state.rows(f"k{i}"), state.rows(f"v{i}"), pad, refine, need)
            if self._has_arm(i):
                cache[f"cov{i}"] = cache[f"cov{i}"] + self._coverage_maps(prev, seen["curr"])[:, :, 0]
            prev = weights
            x = layer.ff_block(x)
        logits = self.out(x[:, 0])
        return logits, replace(state, t=state.t + 1, cache=cache)
