"""Batched greedy decoding on the decoder's incremental interface: an image's rows leave the
decoder state at its end token, so a batch costs what its running images cost."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from .hypothesis import SearchModel, at_least_float32, check_search_args


@torch.inference_mode()
def greedy_search(model: torch.nn.Module, feats: Tensor, mask: Tensor, start_id: int, end_id: int, max_len: int, *,
                  pad_id: int = 0) -> list[list[int]]:
    """Greedy token ids per image, in decoding order, without start/end tokens, cut at `max_len`;
    feats and mask from `model.encode`. Pad and start tokens are never chosen."""
    check_search_args(1, max_len)
    batch = feats.shape[0]
    if batch == 0:
        return []
    decoder = cast(SearchModel, model).decoder
    device = feats.device
    state = decoder.init_state(feats, mask)
    active = torch.arange(batch, device=device)  # original image of each row still running
    prev = torch.full((batch,), start_id, dtype=torch.long, device=device)
    out = torch.full((batch, max_len), pad_id, dtype=torch.long, device=device)
    lengths = [max_len] * batch
    banned = torch.tensor(sorted({pad_id, start_id}), device=device)

    for t in range(max_len):
        logits, state = decoder.step(state, prev)
        logits = at_least_float32(logits)
        logits.index_fill_(1, banned, float("-inf"))
        nxt = logits.argmax(dim=-1)  # ties: the lowest id (torch's documented first maximum)
        out[active, t] = nxt
        ended = nxt == end_id
        if bool(ended.any()):  # one host sync per step: needed to stop at all
            for image in active[ended].tolist():
                lengths[image] = t
            keep = (~ended).nonzero().flatten()
            if keep.numel() == 0:
                break
            state = decoder.reorder_state(state, keep)
            active, nxt = active[keep], nxt[keep]
        prev = nxt

    rows = out.tolist()
    return [row[:n] for row, n in zip(rows, lengths)]
