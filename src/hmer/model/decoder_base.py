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

What a decoder is taught: `make_targets`, the teacher-forcing targets for l2r, r2l and
bidirectional training.

    l2r   in  <sos> y1 .. yn          out  y1 .. yn <eos>
    r2l   in  <eos> yn .. y1          out  yn .. y1 <sos>
    bi    the l2r rows, then the r2l rows (BTTR): the batch doubles, one decoder learns both

Rows are right-padded with pad to the longest sequence + 1. For `bi`, the image batch must be
repeated in the same order (`torch.cat([x, x])`); `HMERModel` does that on the encoded
features, so each image is encoded once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import torch
import torch.nn as nn
from torch import Tensor

from ..config import DIRECTIONS


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


PAD_ID, SOS_ID, EOS_ID = 0, 1, 2  # the project's fixed special ids (hmer.data.vocab.Vocab)


# Host-side list work: under torch.compile this is a graph break, rather than a graph
# specialised (and recompiled) on every batch's token ids.
@torch.compiler.disable
def make_targets(token_ids: Sequence[Sequence[int]], direction: str, vocab=None,
                 device: Optional[torch.device | str] = None) -> tuple[Tensor, Tensor, Tensor]:
    """(tgt_in, tgt_out, pad_mask), long/long/bool [B', L] with B' = B (l2r, r2l) or 2B (bi).

    token_ids: per expression, symbol ids without sos/eos. `vocab`: a Vocab (anything with
    pad_id, sos_id, eos_id) or a (pad, sos, eos) tuple; default the project's fixed 0, 1, 2.
    pad_mask is True at padding (the same positions in tgt_in and tgt_out).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not one of {', '.join(DIRECTIONS)}")
    if isinstance(vocab, (tuple, list)):
        pad, sos, eos = map(int, vocab)
    else:
        pad, sos, eos = (PAD_ID, SOS_ID, EOS_ID) if vocab is None else (vocab.pad_id, vocab.sos_id, vocab.eos_id)
    length = max((len(s) for s in token_ids), default=0) + 1
    ins: list[list[int]] = []
    outs: list[list[int]] = []
    for block in ("l2r", "r2l") if direction == "bi" else (direction,):
        start, stop = (sos, eos) if block == "l2r" else (eos, sos)
        for seq in token_ids:
            seq = list(seq) if block == "l2r" else list(seq)[::-1]
            fill = [pad] * (length - 1 - len(seq))
            ins.append([start] + seq + fill)
            outs.append(seq + [stop] + fill)
    # One tensor per list (not per row): this runs on the host for every training batch.
    tgt_in = torch.tensor(ins, dtype=torch.long).view(len(ins), length)
    tgt_out = torch.tensor(outs, dtype=torch.long).view(len(outs), length)
    pad_mask = tgt_out == pad
    if device is not None:
        tgt_in, tgt_out, pad_mask = tgt_in.to(device), tgt_out.to(device), pad_mask.to(device)
    return tgt_in, tgt_out, pad_mask
