"""The interface every decoder implements, and the state that incremental decoding carries.

    logits = decoder(feats, feat_mask, tgt_in, tgt_pad_mask=None)            # [B, L, V]
    logits, attn = decoder(..., return_attention=True)                      # attn [B, L, h, w]
    state = decoder.init_state(feats, feat_mask)
    logits_t, state = decoder.step(state, tokens_t)                         # tokens_t [N] -> [N, V]
    state = decoder.reorder_state(state, index)                             # index [N'] into the rows

feats [B, h, w, d] and feat_mask [B, h, w] (True = pad) come from `HMERModel.encode`.

`DecoderState` keeps two kinds of tensors:
  * `memory`: per *image* ([B, ...]): the encoded features and anything precomputed from them
    (cross-attention keys/values, attention keys). Never copied when beams are reordered;
  * `cache`: per *row* ([N, ...]): whatever grows or changes with the decoded prefix (KV caches,
    hidden states, coverage sums, convolution histories). Reordered with index_select.
`src_index` [N] maps each row to its image (None = row i is image i). Decoders read memory
for their rows with `state.rows(...)`: a gather when the rows are a reordering/expansion,
free otherwise. `t` counts the tokens fed so far (the position of the next token).

Incremental decoding must reproduce the teacher-forced pass in eval mode; in training mode
(dropout, batch statistics) it is not meant to be used.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor


@dataclass
class DecoderState:
    t: int
    memory: dict[str, Tensor]
    cache: dict[str, Tensor] = field(default_factory=dict)
    src_index: Optional[Tensor] = None

    def rows(self, name: str) -> Tensor:
        """memory[name] for each row: [N, ...]."""
        x = self.memory[name]
        return x if self.src_index is None else x.index_select(0, self.src_index)

    @property
    def num_rows(self) -> int:
        if self.src_index is not None:
            return self.src_index.shape[0]
        return next(iter(self.memory.values())).shape[0]


class Decoder(nn.Module):
    """Base class: subclasses implement forward, init_state and step; reorder_state is shared."""

    def forward(
        self,
        feats: Tensor,
        feat_mask: Tensor,
        tgt_in: Tensor,
        tgt_pad_mask: Optional[Tensor] = None,
        return_attention: bool = False,
    ):
        raise NotImplementedError

    def init_state(self, feats: Tensor, feat_mask: Tensor) -> DecoderState:
        raise NotImplementedError

    def step(self, state: DecoderState, tokens: Tensor) -> tuple[Tensor, DecoderState]:
        raise NotImplementedError

    def reorder_state(self, state: DecoderState, index: Tensor) -> DecoderState:
        """Rows `index` [N'] of the state (beam expansion B -> B*beam, or beam reordering)."""
        index = index.to(device=next(iter(state.memory.values())).device, dtype=torch.long)
        src = index if state.src_index is None else state.src_index.index_select(0, index)
        cache = {k: v.index_select(0, index) for k, v in state.cache.items()}
        return replace(state, cache=cache, src_index=src)
