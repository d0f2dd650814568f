"""Convolutional decoder with multi-step attention (ConvS2S; Gehring et al. 2017).

    g  = embed(y) + position(y)                                     [B, L, d]
    x  = g
    for each of `conv_layers` blocks:
        r = x
        x = GLU(causal_conv_k(dropout(x)))                           kernel `conv_kernel`, d -> 2d -> d
        x = attend(x, g, image) ; x = (x + r) * sqrt(1/2)            residual, scaled
    logits = out(dropout(x))

Attention of one block (fairseq's AttentionLayer, one head), `model.conv_attention`:
    q   = (W_in x + g) * sqrt(1/2)
    gehring (the paper's):
    a   = softmax(q . z_j) over the unpadded image positions j       no 1/sqrt(d)
    c   = sum_j a_j z_j * (m / sqrt(m))                              m = number of unpadded positions,
                                                                     the "scale by m sqrt(1/m)" of the paper
    scaled:
    a   = softmax(q . z_j / sqrt(d)),  c = sum_j a_j z_j            as a transformer's attention
    x   = (W_out c + x) * sqrt(1/2)
On this project's unit-variance features the unscaled scores saturate the softmax and the decoder
reads little of the image: the presets and studies take `scaled` (docs/architecture.md, "ConvS2S's attention").
In the text-to-text model the values are encoder output + source embedding; an image has no
separate source embedding, so keys and values are both the (position-encoded) image features.
Weight normalisation and the paper's dropout-aware initialisation are left out.

Causal convolution: the input is left-padded with kernel-1 zeros, so position t sees tokens
t-k+1 .. t. Incremental decoding keeps, per block, the last kernel-1 block inputs (zeros at
the start, like the padding) and convolves that window with the new input.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional, Sequence, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..config import ModelConfig
from ..registry import DECODERS
from .decoder_base import Decoder, DecoderState
from .accelerations import Dropout
from .posenc import TokenEmbedding

HALF = math.sqrt(0.5)


class ImageAttention(nn.Module):
    """ConvS2S's single-head dot-product attention from a decoder block to the image features."""

    def __init__(self, d_model: int, kind: str):
        super().__init__()
        self.in_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.scaled = kind == "scaled"
        self.score_scale = 1.0 / math.sqrt(d_model) if self.scaled else 1.0

    def forward(self, x: Tensor, target_embedding: Tensor, memory: Tensor, pad: Tensor,
                need_weights: bool) -> tuple[Tensor, Optional[Tensor]]:
        """x, target_embedding [N, L, d]; memory [N, S, d]; pad [N, S] (True = pad)."""
        q = (self.in_proj(x) + target_embedding) * HALF
        if need_weights:
            scores = torch.bmm(q, memory.transpose(1, 2)) * self.score_scale
            scores = scores.masked_fill(pad[:, None, :], float("-inf"))
            weights = torch.softmax(scores.float(), dim=-1).to(x.dtype)
            ctx = torch.bmm(weights, memory)
        else:
            mask = ~pad[:, None, None, :]
            ctx = F.scaled_dot_product_attention(q[:, None], memory[:, None], memory[:, None], attn_mask=mask,
                                                 scale=self.score_scale).squeeze(1)
            weights = None
        if not self.scaled:
            ctx = ctx * (~pad).sum(1).to(x.dtype).sqrt()[:, None, None]  # m * sqrt(1/m)
        return (self.out_proj(ctx) + x) * HALF, weights


class ConvBlock(nn.Module):
    def __init__(self, d_model: int, kernel_size: int, dropout: float, attention: str):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(d_model, 2 * d_model, kernel_size)
        self.attention = ImageAttention(d_model, attention)
        self.dropout = Dropout(dropout)

    def glu_conv(self, window: Tensor) -> Tensor:
        """window [N, T + k - 1, d] (left context included) -> [N, T, d]"""
        return F.glu(self.conv(window.transpose(1, 2)), dim=1).transpose(1, 2)


# ConvS2S's own position embeddings are learned (Gehring et al.), and its attention is the scaled one
# (see the module's docstring): a study that varies the decoder gives both to this one.
@DECODERS.register("convs2s", linked={"model.token_pos": "learned", "model.conv_attention": "scaled"})
class ConvS2SDecoder(Decoder):
    """ConvS2S decoder: gated causal convolutions with multi-step attention (Gehring et al.)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.embed = TokenEmbedding(cfg)
        # a ModuleList (its blocks are submodules), typed by what it holds
        self.blocks = cast(Sequence[ConvBlock], nn.ModuleList(
            ConvBlock(d, cfg.conv_kernel, cfg.dropout, cfg.conv_attention) for _ in range(cfg.conv_layers)))
        self.dropout = Dropout(cfg.dropout)
        self.out = nn.Linear(d, cfg.vocab_size)

    def forward(self, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor] = None,
                return_attention: bool = False):
        b, h, w, d = feats.shape
        memory = feats.reshape(b, h * w, d)
        pad = feat_mask.reshape(b, h * w)
        g = self.embed(tgt_in)
        x = self.dropout(g)
        weights = None
        for i, block in enumerate(self.blocks):
            residual = x
            y = F.pad(block.dropout(x), (0, 0, block.kernel_size - 1, 0))  # causal: zeros on the left
            y = block.glu_conv(y)
            need = return_attention and i == len(self.blocks) - 1
            y, weights = block.attention(y, g, memory, pad, need)
            x = (y + residual) * HALF
        logits = self.out(self.dropout(x))
        if return_attention:
            assert weights is not None  # the last block's weights were asked for
            return logits, weights.view(b, -1, h, w)
        return logits

    def init_state(self, feats: Tensor, feat_mask: Tensor) -> DecoderState:
        b, h, w, d = feats.shape
        cache = {f"history{i}": feats.new_zeros(b, block.kernel_size - 1, d) for i, block in enumerate(self.blocks)}
        return DecoderState(t=0, memory={"feats": feats.reshape(b, h * w, d), "mask": feat_mask}, cache=cache)

    def step(self, state: DecoderState, tokens: Tensor) -> tuple[Tensor, DecoderState]:
        memory = state.rows("feats")
        n = memory.shape[0]
        pad = state.rows("mask").reshape(n, -1)
        g = self.embed(tokens.reshape(n, 1), start=state.t)
        x = g
        cache = {}
        for i, block in enumerate(self.blocks):
            window = torch.cat([state.cache[f"history{i}"], x], dim=1)  # [N, k, d]
            cache[f"history{i}"] = window[:, 1:]
            y = block.glu_conv(window)
            y, _ = block.attention(y, g, memory, pad, need_weights=False)
            x = (y + x) * HALF
        logits = self.out(x[:, 0])
        return logits, replace(state, t=state.t + 1, cache=cache)
