"""`decode_batch`: images in, token ids out, with the search the model's direction calls for.

The one entry point that training, evaluation, the CLI and the benchmarks use, so every
number in a table comes from the same decoding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .beam import beam_search
from .greedy import greedy_search
from .hypothesis import check_search_args
from .joint import joint_beam_search
from .reference_search import reference_decode

DIRECTIONS = ("l2r", "r2l", "bi")


@torch.inference_mode()
def decode_batch(
    model: torch.nn.Module,
    images: Tensor,
    image_mask: Tensor,
    direction: str,
    beam_size: int = 10,
    max_len: int = 200,
    length_penalty: float = 1.0,
    sos_id: int = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    search_rule: str = "hmer",
) -> list[list[int]]:
    """Per image, the decoded symbol ids in left-to-right order, without sos/eos.

    images [B, 1, H, W], image_mask [B, H, W] (True = pad). Encodes once, then:
      beam_size == 1   greedy; from `<sos>` for l2r and bi, from `<eos>` (then reversed) for r2l;
      l2r              beam search from `<sos>`;
      r2l              beam search from `<eos>`, the tokens reversed;
      bi               BTTR's joint search (both directions, each rescored by the other).
    `search_rule` (beam_size > 1): `hmer`, the project's batched searches above, or `bttr` /
    `comer`, the references' own searches (hmer.decoding.reference_search).
    The model should be in eval mode (incremental decoding reproduces teacher forcing only
    there); this function does not change its mode.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not one of {', '.join(DIRECTIONS)}")
    check_search_args(beam_size, max_len)
    if images.shape[0] == 0:
        return []
    feats, mask = model.encode(images, image_mask)
    start, end = (eos_id, sos_id) if direction == "r2l" else (sos_id, eos_id)

    if beam_size == 1:
        seqs = greedy_search(model, feats, mask, start, end, max_len, pad_id=pad_id)
    elif search_rule != "hmer":
        results = reference_decode(model, feats, mask, search_rule, direction, sos_id, eos_id, beam_size, max_len,
                                   length_penalty, pad_id=pad_id)
        return [r.best.tokens for r in results]  # already left to right
    elif direction == "bi":
        return [
            h.tokens
            for h in joint_beam_search(
                model, feats, mask, sos_id, eos_id, beam_size, max_len, length_penalty, pad_id=pad_id
            )
        ]
    else:
        pools = beam_search(model, feats, mask, start, end, beam_size, max_len, length_penalty, pad_id=pad_id)
        seqs = [pool[0].tokens for pool in pools]
    return [s[::-1] for s in seqs] if direction == "r2l" else seqs
