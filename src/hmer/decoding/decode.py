"""`decode_batch`: the one entry point of training, evaluation, the CLI and the benchmarks, so
every number comes from the same decoding. Beam searches are looked up by `train.search_rule` in
hmer.registry.SEARCH_RULES: `hmer` here, BTTR's and CoMER's in `reference_search`; beam size 1 is
`greedy_search`, batched on the decoder's incremental interface: an image's rows leave the decoder
state at its end token, so a batch costs what its running images cost.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from ..config import DIRECTIONS
from ..registry import SEARCH_RULES
from .beam import SearchModel, at_least_float32, beam_search, check_search_args
from .joint import joint_beam_search


@torch.inference_mode()
def decode_batch(model: torch.nn.Module, images: Tensor, image_mask: Tensor, direction: str, beam_size: int = 10,
                 max_len: int = 200, length_penalty: float = 1.0, sos_id: int = 1, eos_id: int = 2, pad_id: int = 0,
                 search_rule: str = "hmer") -> list[list[int]]:
    """Per image, the decoded symbol ids left to right, without sos/eos; images [B, 1, H, W],
    image_mask [B, H, W] (True = pad). beam_size 1 is greedy whatever the rule (r2l from `<eos>`,
    reversed); else the search registered as `search_rule`. The model should be in eval mode
    (only there does incremental decoding reproduce teacher forcing); its mode is left as it is.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not one of {', '.join(DIRECTIONS)}")
    check_search_args(beam_size, max_len)
    if images.shape[0] == 0:
        return []
    search = None if beam_size == 1 else SEARCH_RULES.get(search_rule)
    feats, mask = cast(SearchModel, model).encode(images, image_mask)
    if search is None:
        start, end = (eos_id, sos_id) if direction == "r2l" else (sos_id, eos_id)
        seqs = greedy_search(model, feats, mask, start, end, max_len, pad_id=pad_id)
        return [s[::-1] for s in seqs] if direction == "r2l" else seqs
    return search(model, feats, mask, direction, beam_size=beam_size, max_len=max_len,
                  length_penalty=length_penalty, sos_id=sos_id, eos_id=eos_id, pad_id=pad_id)


@SEARCH_RULES.register("hmer")
def hmer_search(model, feats: Tensor, mask: Tensor, direction: str, *, beam_size: int, max_len: int,
                length_penalty: float, sos_id: int, eos_id: int, pad_id: int) -> list[list[int]]:
    """The project's batched searches: beam search in one direction; BTTR's joint search for bi."""
    if direction == "bi":
        hyps = joint_beam_search(model, feats, mask, sos_id, eos_id, beam_size, max_len, length_penalty, pad_id=pad_id)
        return [h.tokens for h in hyps]
    start, end = (eos_id, sos_id) if direction == "r2l" else (sos_id, eos_id)
    pools = beam_search(model, feats, mask, start, end, beam_size, max_len, length_penalty, pad_id=pad_id)
    seqs = [pool[0].tokens for pool in pools]
    return [s[::-1] for s in seqs] if direction == "r2l" else seqs


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
