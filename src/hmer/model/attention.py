"""Multi-head attention that can expose its pre-softmax scores and take a refinement term.

The fast path is `F.scaled_dot_product_attention` (flash / memory-efficient kernels on GPU).
Two things need the explicit path, which materialises the scores [B, H, L, S]:

  * a *refinement* (CoMER's Attention Refinement Module): a callable that receives the
    attention probabilities of this call (softmax of the plain scores) and returns a term
    that is subtracted from the scores before a second softmax:
        scores  = q k^T / sqrt(d_head)          (padding -> -inf)
        attn    = softmax(scores)
        scores' = scores - refine(attn)
        attn'   = softmax(scores')               (what the values are averaged with)
  * `need_weights=True` (attention maps for visualisation, or a coverage that needs them).

The weights returned are the final probabilities before dropout (which applies only to the
copy that averages the values). CPU training with dropout also takes the explicit path, for its
cheap masks (hmer.model.accelerations).

Tensors are batch-first; heads live in dim 1: q [B, H, L, dh], k/v [B, H, S, dh].
Masks are True at padding (`key_padding_mask` [B, S]). Rows may share keys and values: with
N = g * B query rows, row r attends to keys r // g (`accelerations.grouped_attention`).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .accelerations import Attended, Dropout, free_to_read, grouped_attention

Refinement = Callable[[Tensor], Tensor]  # attn probs [B, H, L, S] -> term [B, H, L, S]


def masked_softmax(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """softmax over the last dim of `scores + mask` (`additive_mask`), in float32 for stability,
    cast back to the scores' dtype."""
    if mask is not None:
        scores = scores + mask
    return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


def additive_mask(pad: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where a position may be attended, -inf at `pad`. Added to the scores it masks them as
    `masked_fill` would, to the bit, in one pass instead of a copy and a fill, and its backward
    passes the gradient through (the softmax gives masked positions none). Broadcast: [B, 1, 1, S]
    or [L, L], an eighth or less of the scores."""
    return torch.zeros(pad.shape, dtype=dtype, device=pad.device).masked_fill_(pad, float("-inf"))


def causal_pad_mask(length: int, device: torch.device) -> Tensor:
    """[L, L] True above the diagonal: position i may not look at j > i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention with `nhead` heads; projections with bias (as nn.MultiheadAttention)."""

    def __init__(self, d_model: int, nhead: int, dropout: float = 0.0):
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"d_model={d_model} is not divisible by nhead={nhead}")
        self.nhead = nhead
        self.head_dim = d_model // nhead
        self.dropout = Dropout(dropout)  # of the weights that average the values
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # nn.MultiheadAttention's init: xavier-uniform projections, zero biases.
        for lin in (self.q_proj, self.kv_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: Tensor, memory: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
                causal: bool = False, refine: Optional[Refinement] = None, need_weights: bool = False,
                kv: Optional[tuple[Tensor, Tensor]] = None, need_unrefined: bool = False) -> Attended:
        """Self-attention over x [N, L, d], or cross-attention to memory [B, S, d], or to keys and
        values projected already (`kv`, [B, H, S, dh] each: incremental decoding's caches)."""
        k, v = kv if kv is not None else self.project_kv(x if memory is None else memory)
        out, weights, unrefined = self.attend(self.q_proj(x), k, v, key_padding_mask, causal, refine, need_weights,
                                              need_unrefined)
        return Attended(self.out_proj(out), weights, unrefined)

    # ---- projections ------------------------------------------------------------------------
    def split_heads(self, x: Tensor) -> Tensor:
        """[B, L, d] -> [B, H, L, dh]"""
        b, length, _ = x.shape
        return x.view(b, length, self.nhead, self.head_dim).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.kv_heads(self.kv_proj(x))

    def kv_heads(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """kv_proj's output [B, L, 2d] -> k, v [B, H, L, dh]"""
        k, v = kv.chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    # ---- attention --------------------------------------------------------------------------
    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Pre-softmax scores [B, H, L, S] = (q / sqrt(dh)) k^T: the scale applied to q, S / dh
        times fewer multiplies than to the scores (and as many fewer in backward)."""
        return torch.matmul(q * (1.0 / math.sqrt(self.head_dim)), k.transpose(-2, -1))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False,
               refine: Optional[Refinement] = None, need_weights: bool = False,
               need_unrefined: bool = False) -> Attended:
        """q [N, L, d] (projected) against k, v [B, H, S, dh]: the heads' outputs side by side
        [N, L, d], before out_proj (so that it can run on packed tokens, accelerations.PackedTokens),
        with the weights [N, H, L, S] where the explicit path computed them."""
        if q.shape[0] != k.shape[0]:
            return grouped_attention(self, q, k, v, key_padding_mask, refine, need_weights, need_unrefined)
        q = self.split_heads(q)
        dropout_p = self.dropout.p if self.training else 0.0
        if key_padding_mask is not None and free_to_read(key_padding_mask) and not key_padding_mask.any():
            key_padding_mask = None  # nothing to mask: spares a pass over the scores
        # SDPA draws its attention dropout with bernoulli_: the cheap masks take the explicit path.
        fused = refine is None and not need_weights and not need_unrefined and \
            (dropout_p == 0.0 or not self.dropout.cheap_masks)
        weights = unrefined = None
        pad = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        if causal and (pad is not None or not fused):  # (SDPA's is_causal alone, without a padding mask)
            c = causal_pad_mask(q.shape[2], q.device)
            pad = c if pad is None else pad | c
            causal = False
        if fused:  # SDPA's mask: True = may attend
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if pad is None else ~pad, dropout_p=dropout_p,
                                                 is_causal=causal)
        else:
            scores = self.scores(q, k)
            mask = additive_mask(pad, scores.dtype) if pad is not None else None
            weights = unrefined = masked_softmax(scores, mask)
            if refine is not None:
                weights = masked_softmax(scores - refine(unrefined), mask)
            out = torch.matmul(self.dropout(weights), v)
        b, _, length, _ = out.shape
        return Attended(out.transpose(1, 2).reshape(b, length, self.nhead * self.head_dim), weights, unrefined)
