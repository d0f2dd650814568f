"""BTTR's bidirectional approximate joint search (`bttr/model/decoder.py` `beam_search` +
`_cross_rate_score`, `bttr/lit_bttr.py`), for one decoder trained l2r (`<sos>` to `<eos>`) and r2l:

1. beam search in both directions, batched over 2B rows (every image's l2r rows, then its r2l
   rows) as CoMER does, so the directions share every step;
2. each finished hypothesis is rescored by the opposite direction with teacher forcing, its end
   token included (BTTR's `to_tgt_output` puts the stop token in the target);
3. joint score = (own + opposite log-prob) / max(len, 1) ** alpha: BTTR adds the raw sums and
   normalises once;
4. the best joint score wins (ties: l2r before r2l, then the beam's order).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .beam import NEG_INF, Hypothesis, at_least_float32, beam_search, check_search_args, length_normalized


@torch.inference_mode()
def joint_beam_search(model: torch.nn.Module, feats: Tensor, mask: Tensor, sos_id: int = 1, eos_id: int = 2,
                      beam_size: int = 10, max_len: int = 200, length_penalty: float = 1.0, *,
                      pad_id: int = 0) -> list[Hypothesis]:
    """The best hypothesis per image by joint score, tokens left to right, `log_prob` the joint
    sum. The model also needs `.decode(feats, feat_mask, tgt_in, group=g) -> logits [N, L, V]`
    (teacher forcing, row r reading image r // g)."""
    check_search_args(beam_size, max_len)
    batch = feats.shape[0]
    if batch == 0:
        return []
    pools = beam_search(model, torch.cat([feats, feats]), torch.cat([mask, mask]), [sos_id] * batch + [eos_id] * batch,
                        [eos_id] * batch + [sos_id] * batch, beam_size, max_len, length_penalty, pad_id=pad_id)

    # Every candidate (image, tokens left to right, log-prob, found l2r), rescored in the other direction,
    # the sequence in that direction's reading order.
    found = [(i, hyp.tokens if l2r else hyp.tokens[::-1], hyp.log_prob, l2r)
             for i in range(batch) for l2r, pool in ((True, pools[i]), (False, pools[batch + i])) for hyp in pool]
    other_log_prob = sequence_log_probs(model, feats, mask, [i for i, *_ in found],
                                        [seq[::-1] if l2r else seq for _, seq, _, l2r in found],
                                        [eos_id if l2r else sos_id for *_, l2r in found],
                                        [sos_id if l2r else eos_id for *_, l2r in found], pad_id=pad_id)
    alpha = float(length_penalty)
    best: list[Hypothesis | None] = [None] * batch
    for (i, seq, own, _), other in zip(found, other_log_prob):
        total = own + other
        cand = Hypothesis(list(seq), length_normalized(total, len(seq), alpha), total)
        current = best[i]
        if current is None or cand.score > current.score:  # strict: ties keep the earlier one
            best[i] = cand
    return [h if h is not None else Hypothesis([], NEG_INF, NEG_INF) for h in best]


# Rows x target length x feature cells of one rescoring call: CoMER's ARM activations grow with
# it. Unchunked, tiny-comer's joint search over 4 images of 2014 (random weights, 200-token
# hypotheses) peaked at 5.9 GB against 0.50 GB for beam search alone; chunks of 4 M / 1 M / 256 K
# cells peaked at 1.5 / 0.76 / 0.52 GB, and ran faster (CPU, 2026-11-21). 2 M cells is about 2 GB
# of ARM activations for paper-size CoMER in fp32.
RESCORE_CELLS = 1 << 21


def sequence_log_probs(model: torch.nn.Module, feats: Tensor, mask: Tensor, images: Sequence[int],
                       sequences: Sequence[Sequence[int]], start_ids: Sequence[int], end_ids: Sequence[int], *,
                       pad_id: int = 0, max_cells: int = RESCORE_CELLS) -> list[float]:
    """Teacher-forced summed log-probability of each `sequences[j]` (in the decoder's reading
    order, end token included), read from image `images[j]`, decoded from `start_ids[j]`.

    Rows are grouped by image, so one `model.decode(..., group=g)` reads each image's features once
    for all its rows. Groups, sorted by longest row, are decoded in chunks of at most `max_cells`
    rows x length x feature cells (an image over budget alone is split), padded with all-pad rows
    to one width. Rows are right-padded with `pad_id`: causal attention never sees a pad, and pad
    positions are left out of the sum.
    """
    n = len(sequences)
    if n == 0:
        return []
    if not (len(images) == len(start_ids) == len(end_ids) == n):
        raise ValueError("images, sequences, start_ids and end_ids must have the same length")
    cells = int(feats.shape[1]) * int(feats.shape[2])
    by_image: dict[int, list[int]] = {}
    for j in range(n):
        by_image.setdefault(int(images[j]), []).append(j)
    groups: list[tuple[int, list[int]]] = []  # (image, its rows), each within the budget alone
    for image, rows in by_image.items():
        rows = sorted(rows, key=lambda j: len(sequences[j]))
        group: list[int] = []
        for j in rows:
            if group and (len(group) + 1) * (len(sequences[j]) + 1) * cells > max_cells:
                groups.append((image, group))
                group = []
            group.append(j)
        groups.append((image, group))
    groups.sort(key=lambda g: (max(len(sequences[j]) for j in g[1]) + 1, g[0]))
    out = [0.0] * n
    chunk: list[tuple[int, list[int]]] = []
    width = longest = 0  # the chunk's rows per group, and its longest row (+1 for the start)
    for image, rows in groups:
        new_width = max(width, len(rows))
        new_longest = max(longest, max(len(sequences[j]) for j in rows) + 1)
        if chunk and (len(chunk) + 1) * new_width * new_longest * cells > max_cells:
            _rescore_chunk(model, feats, mask, sequences, start_ids, end_ids, chunk, width, out, pad_id)
            chunk, new_width, new_longest = [], len(rows), max(len(sequences[j]) for j in rows) + 1
        chunk.append((image, rows))
        width, longest = new_width, new_longest
    _rescore_chunk(model, feats, mask, sequences, start_ids, end_ids, chunk, width, out, pad_id)
    return out


def _rescore_chunk(model, feats: Tensor, mask: Tensor, sequences, start_ids, end_ids,
                   groups: list[tuple[int, list[int]]], width: int, out: list[float], pad_id: int) -> None:
    """One `model.decode(..., group=width)` over `groups` (image, rows); the sums go into `out`."""
    device = feats.device
    length = max(len(sequences[j]) for _, rows in groups for j in rows) + 1
    filler = [pad_id] * length
    tgt_in, tgt_out, where = [], [], []
    for _, rows in groups:
        for j in rows:
            gap = [pad_id] * (length - 1 - len(sequences[j]))
            tgt_in.append([start_ids[j]] + list(sequences[j]) + gap)
            tgt_out.append(list(sequences[j]) + [end_ids[j]] + gap)
            where.append(j)
        for _ in range(width - len(rows)):
            tgt_in.append(filler)
            tgt_out.append(filler)
            where.append(-1)
    tgt_in_t = torch.tensor(tgt_in, dtype=torch.long, device=device)
    tgt_out_t = torch.tensor(tgt_out, dtype=torch.long, device=device)
    index = torch.tensor([image for image, _ in groups], dtype=torch.long, device=device)
    logits = model.decode(feats.index_select(0, index), mask.index_select(0, index), tgt_in_t, group=width)
    logp = torch.log_softmax(at_least_float32(logits), dim=-1).gather(2, tgt_out_t.unsqueeze(2)).squeeze(2)
    for j, value in zip(where, logp.masked_fill(tgt_out_t == pad_id, 0.0).sum(dim=1).tolist()):
        if j >= 0:
            out[j] = value
