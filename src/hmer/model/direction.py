"""Decoding direction: teacher-forcing targets for l2r, r2l and bidirectional training.

    l2r   in  <sos> y1 .. yn          out  y1 .. yn <eos>
    r2l   in  <eos> yn .. y1          out  yn .. y1 <sos>
    bi    the l2r rows, then the r2l rows (BTTR): the batch doubles, one decoder learns both

Rows are right-padded with pad to the longest sequence + 1. For `bi`, the image batch must be
repeated in the same order (`torch.cat([x, x])`); `HMERModel` does that on the encoded
features, so each image is encoded once.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ..config import DIRECTIONS

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
