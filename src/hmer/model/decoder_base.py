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
`src_index` [N] maps each row to its image (None = row i is image i); `state.rows(...)` reads memory
for the rows (a gather only after a reordering). `t` counts the tokens fed so far.

Beam search keeps its rows image-major, `group` rows per image, and says so
(`reorder_state(state, index, group=beam_size)`): memory is then kept for the live images
only, in row order, and `state.groups(...)` reads it without a gather (row r belongs to memory
entry r // group). A decoder can then attend to the image with the group's rows as one query
block per image, instead of copying the image's keys/values for every row at every step
(at beam 10 and 64 images, about 40 MB a layer a step, most of a CPU decode's time).

Incremental decoding reproduces the teacher-forced pass in eval mode; not meant for training mode.
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
    group: int = 0  # > 0: rows come in contiguous groups of `group`, group i reads memory entry i

    def groups(self, name: str) -> Tensor:
        """memory[name] for each group of rows: [N // group, ...]; only when `group` is set."""
        if self.group <= 0:
            raise ValueError("the rows of this state are not grouped by image (reorder_state(..., group=k))")
        return self.memory[name]

    def rows(self, name: str) -> Tensor:
        """memory[name] for each row: [N, ...]."""
        x = self.memory[name]
        return x if self.src_index is None else x.index_select(0, self.src_index)


class Decoder(nn.Module):
    """Base class: subclasses implement forward, init_state and step; reorder_state is shared.

    A decoder whose `reads_grouped_memory` is True also takes feats [B, ...] with tgt_in [B * g, L], row r
    reading image r // g (joint search's rescoring, `bi` training); HMERModel.decode repeats the features
    for the others."""

    reads_grouped_memory = False

    def forward(self, feats: Tensor, feat_mask: Tensor, tgt_in: Tensor, tgt_pad_mask: Optional[Tensor] = None,
                return_attention: bool = False):
        raise NotImplementedError

    def init_state(self, feats: Tensor, feat_mask: Tensor) -> DecoderState:
        raise NotImplementedError

    def step(self, state: DecoderState, tokens: Tensor) -> tuple[Tensor, DecoderState]:
        raise NotImplementedError

    def reorder_state(self, state: DecoderState, index: Tensor, group: int = 0) -> DecoderState:
        """Rows `index` [N'] of the state (beam expansion B -> B*beam, or beam reordering); with group > 0
        (the module docstring) memory is cut down to the groups' images, a copy only when that set changes."""
        index = index.to(device=next(iter(state.memory.values())).device, dtype=torch.long)
        src = index if state.src_index is None else state.src_index.index_select(0, index)
        cache = {k: v.index_select(0, index) for k, v in state.cache.items()}
        if group <= 0:
            return replace(state, cache=cache, src_index=src, group=0)
        if src.shape[0] % group:
            raise ValueError(f"{src.shape[0]} rows do not come in groups of {group}")
        images = src[::group]
        memory = state.memory
        if not torch.equal(images, torch.arange(len(images), device=images.device)) or \
                len(images) != next(iter(memory.values())).shape[0]:
            memory = {k: v.index_select(0, images) for k, v in memory.items()}
        src = torch.arange(len(images), device=images.device).repeat_interleave(group)
        return replace(state, memory=memory, cache=cache, src_index=src, group=group)
