"""GRU decoder with coverage attention (WAP / DenseWAP; Zhang et al. 2017, 2018).

One decoding step, as WAP's conditional GRU (`gru_cond_layer` in JianshuZhang/WAP):

    h1    = GRU_1(embed(y_{t-1}), h_{t-1})               first GRU: "predicts" from the last token
    F     = Q * beta_t                                   coverage: conv k x k over the sum
                                                         beta_t of all past attention maps
    e     = v^T tanh(W_a h1 + U_a a + U_f F) + c          a: image features (per position)
    alpha = softmax(e) over the unpadded positions
    ctx   = sum alpha * a
    h_t   = GRU_2(ctx, h1)                               second GRU: updates with what it saw
    logit = W_o dropout(maxout_2(W_h h_t + W_e embed(y_{t-1}) + W_c ctx))

with h_0 = tanh(W_init mean(a over unpadded positions)). WAP's conv_Q then conv_Uf are two linear
maps in a row; one k x k convolution straight to the attention dim (`rnn_attention`) is the same
function class with fewer parameters.

The teacher-forced pass loops over time (each attention depends on the past coverage); what does
not depend on the recurrence (U_a a, the embedding, the readout) is computed for all steps at once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from ..config import ModelConfig
from ..registry import DECODERS
from .accelerations import Dropout, same_conv_as_matmul
from .decoder_base import Decoder, DecoderState


class CoverageAttention(nn.Module):
    """WAP's attention: additive (Bahdanau) scores plus a convolution of the coverage map."""

    coverage_as_matmul = False  # hmer.model.accelerations

    def __init__(self, hidden: int, feat_dim: int, att_dim: int, kernel_size: int):
        super().__init__()
        self.query = nn.Linear(hidden, att_dim, bias=False)  # W_a
        self.key = nn.Linear(feat_dim, att_dim)  # U_a (+ b)
        self.coverage = nn.Conv2d(1, att_dim, kernel_size, padding=kernel_size // 2, bias=False)  # U_f Q
        self.energy = nn.Linear(att_dim, 1)  # v, c

    def forward(self, h: Tensor, keys: Tensor, feats: Tensor, coverage: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """h [N, hid]; keys [N, S, att] (= U_a a, precomputed); feats [N, S, d]; coverage [N, S];
        mask [N, h, w] (True = pad). Returns context [N, d] and alpha [N, S]."""
        n, hh, ww = mask.shape
        cov = self.coverage_term(coverage.view(n, 1, hh, ww))
        e = self.energy(torch.tanh(keys + self.query(h)[:, None, :] + cov)).squeeze(-1)  # [N, S]
        e = e.masked_fill(mask.reshape(n, -1), float("-inf"))
        alpha = torch.softmax(e.float(), dim=-1).to(feats.dtype)
        context = torch.bmm(alpha[:, None, :], feats).squeeze(1)
        return context, alpha

    def coverage_term(self, coverage: Tensor) -> Tensor:
        """U_f Q beta: the coverage map [N, 1, h, w] convolved to the attention dim, [N, S, att]; as a
        matrix product in CPU training (`coverage_as_matmul`; it runs once per token). Without
        gradients the convolution itself is faster (0.37 against 0.80 ms)."""
        if self.coverage_as_matmul and torch.is_grad_enabled():
            return same_conv_as_matmul(self.coverage, coverage)
        return self.coverage(coverage).flatten(2).transpose(1, 2)


@DECODERS.register("rnn")
class GRUDecoder(Decoder):
    """WAP / DenseWAP decoder: two GRU cells around a coverage attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hid, emb, att = cfg.d_model, cfg.rnn_hidden, cfg.rnn_embedding, cfg.rnn_attention
        if emb % 2:
            raise ValueError(f"model.rnn_embedding={emb} must be even (maxout of 2)")
        self.embed = nn.Embedding(cfg.vocab_size, emb)
        self.init_hidden = nn.Linear(d, hid)
        self.gru1 = nn.GRUCell(emb, hid)
        self.attention = CoverageAttention(hid, d, att, cfg.rnn_coverage_kernel)
        self.gru2 = nn.GRUCell(d, hid)
        self.readout_hidden = nn.Linear(hid, emb)
        self.readout_embed = nn.Linear(emb, emb)
        self.readout_context = nn.Linear(d, emb)
        self.dropout = Dropout(cfg.dropout)
        self.out = nn.Linear(emb // 2, cfg.vocab_size)

    def _initial_hidden(self, memory: Tensor, pad: Tensor) -> Tensor:
        valid = (~pad).to(memory.dtype)[..., None]
        mean = (memory * valid).sum(1) / valid.sum(1).clamp_min(1)
        return torch.tanh(self.init_hidden(mean))

    def _readout(self, h: Tensor, emb: Tensor, ctx: Tensor) -> Tensor:
        x = self.readout_hidden(h) + self.readout_embed(emb) + self.readout_context(ctx)
        x = x.unflatten(-1, (-1, 2)).amax(-1)  # maxout over pairs
        return self.out(self.dropout(x))

    def forward(self, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor] = None,
                return_attention: bool = False):
        b, h, w, d = feats.shape
        memory = feats.reshape(b, h * w, d)
        pad = feat_mask.reshape(b, h * w)
        keys = self.attention.key(memory)
        emb = self.embed(tgt_in)  # [B, L, E]
        hidden = self._initial_hidden(memory, pad)
        coverage = memory.new_zeros(b, h * w)
        hiddens, contexts, alphas = [], [], []
        for t in range(tgt_in.shape[1]):
            h1 = self.gru1(emb[:, t], hidden)
            ctx, alpha = self.attention(h1, keys, memory, coverage, feat_mask)
            coverage = coverage + alpha
            hidden = self.gru2(ctx, h1)
            hiddens.append(hidden)
            contexts.append(ctx)
            alphas.append(alpha)
        logits = self._readout(torch.stack(hiddens, 1), emb, torch.stack(contexts, 1))
        if return_attention:
            return logits, torch.stack(alphas, 1).view(b, -1, h, w)
        return logits

    def init_state(self, feats: Tensor, feat_mask: Tensor) -> DecoderState:
        b, h, w, d = feats.shape
        memory = feats.reshape(b, h * w, d)
        pad = feat_mask.reshape(b, h * w)
        return DecoderState(t=0, memory={"feats": memory, "keys": self.attention.key(memory), "mask": feat_mask},
                            cache={"hidden": self._initial_hidden(memory, pad), "coverage": memory.new_zeros(b, h * w)})

    def step(self, state: DecoderState, tokens: Tensor) -> tuple[Tensor, DecoderState]:
        emb = self.embed(tokens)
        h1 = self.gru1(emb, state.cache["hidden"])
        ctx, alpha = self.attention(h1, state.rows("keys"), state.rows("feats"), state.cache["coverage"],
                                    state.rows("mask"))
        hidden = self.gru2(ctx, h1)
        logits = self._readout(hidden, emb, ctx)
        cache = {"hidden": hidden, "coverage": state.cache["coverage"] + alpha}
        return logits, replace(state, t=state.t + 1, cache=cache)
