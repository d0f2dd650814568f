"""BTTR's bidirectional approximate joint search.

A bidirectional model is one decoder trained left-to-right (from `<sos>`, ending at `<eos>`)
and right-to-left (from `<eos>`, ending at `<sos>`). Joint search (BTTR, `bttr/model/decoder.py`
`beam_search` + `_cross_rate_score`, and `bttr/lit_bttr.py`):

1. beam search in both directions; here in one batched search over 2B rows (the l2r rows of
   every image, then its r2l rows), as CoMER does, so the two directions share every step;
2. every finished hypothesis is rescored by the *opposite* direction with teacher forcing:
   the summed log-probability of the sequence in that direction, its end token included
   (BTTR's `to_tgt_output` puts the stop token in the target);
3. joint score = (own log-prob + opposite log-prob) / max(len, 1) ** alpha, where own log-prob
   includes its end token and len counts the tokens without start/end: BTTR adds the two raw
   sums and normalises once, by `len(h) ** alpha` with `len` at least 1 (`Hypothesis.__len__`);
4. the best joint score over both directions' hypotheses wins (ties: l2r before r2l, then
   the beam's own order).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .beam import NEG_INF, beam_search
from .hypothesis import Hypothesis, at_least_float32, check_search_args, length_normalized


@torch.inference_mode()
def joint_beam_search(
    model: torch.nn.Module,
    feats: Tensor,
    mask: Tensor,
    sos_id: int = 1,
    eos_id: int = 2,
    beam_size: int = 10,
    max_len: int = 200,
    length_penalty: float = 1.0,
    *,
    pad_id: int = 0,
    exhaustive: bool = False,
) -> list[Hypothesis]:
    """The best hypothesis per image by joint (l2r + r2l) score, tokens in left-to-right order.

    model: anything with `.decoder` (incremental interface) and
    `.decode(feats, feat_mask, tgt_in, group=g) -> logits [N, L, V]` (teacher forcing, one row per
    tgt row, row r reading image r // g).
    The returned `log_prob` is the joint sum, `score` its length-normalised value.
    """
    check_search_args(beam_size, max_len)
    batch = feats.shape[0]
    if batch == 0:
        return []
    pools = beam_search(
        model,
        torch.cat([feats, feats]),
        torch.cat([mask, mask]),
        [sos_id] * batch + [eos_id] * batch,
        [eos_id] * batch + [sos_id] * batch,
        beam_size,
        max_len,
        length_penalty,
        pad_id=pad_id,
        exhaustive=exhaustive,
    )

    # Every candidate in left-to-right order, with what the opposite direction must score.
    images: list[int] = []
    l2r_tokens: list[list[int]] = []
    own_log_prob: list[float] = []
    targets: list[list[int]] = []  # the sequence in the rescoring direction's order
    starts: list[int] = []
    ends: list[int] = []
    for i in range(batch):
        for hyp in pools[i]:  # found left-to-right: rescored right-to-left
            images.append(i)
            l2r_tokens.append(hyp.tokens)
            own_log_prob.append(hyp.log_prob)
            targets.append(hyp.tokens[::-1])
            starts.append(eos_id)
            ends.append(sos_id)
        for hyp in pools[batch + i]:  # found right-to-left: rescored left-to-right
            seq = hyp.tokens[::-1]
            images.append(i)
            l2r_tokens.append(seq)
            own_log_prob.append(hyp.log_prob)
            targets.append(seq)
            starts.append(sos_id)
            ends.append(eos_id)

    other_log_prob = sequence_log_probs(model, feats, mask, images, targets, starts, ends, pad_id=pad_id)

    alpha = float(length_penalty)
    best: list[Hypothesis | None] = [None] * batch
    for i, seq, own, other in zip(images, l2r_tokens, own_log_prob, other_log_prob):
        total = own + other
        cand = Hypothesis(list(seq), length_normalized(total, len(seq), alpha), total)
        current = best[i]
        if current is None or cand.score > current.score:  # strict: ties keep the earlier one
            best[i] = cand
    return [h if h is not None else Hypothesis([], NEG_INF, NEG_INF) for h in best]


# Rows x target length x feature-map cells of one teacher-forced rescoring call. CoMER's ARM
# convolves the coverage of every (row, head, step), so its activations grow with this product
# times heads x coverage channels. Unchunked, tiny-comer's joint search over 4 images of 2014
# with random weights (200-token hypotheses) peaked at 5.9 GB against 0.50 GB for its beam search
# alone; chunks of 4 M / 1 M / 256 K cells peaked at 1.5 / 0.76 / 0.52 GB, and ran faster, not
# slower (CPU, 2026-11-21). 2 M cells is about 2 GB of ARM activations for CoMER at paper size
# in fp32 (8 heads x 32 channels), in chunks of about 80 rows of 20-token hypotheses.
RESCORE_CELLS = 1 << 21


def sequence_log_probs(
    model: torch.nn.Module,
    feats: Tensor,
    mask: Tensor,
    images: Sequence[int],
    sequences: Sequence[Sequence[int]],
    start_ids: Sequence[int],
    end_ids: Sequence[int],
    *,
    pad_id: int = 0,
    max_cells: int = RESCORE_CELLS,
) -> list[float]:
    """Teacher-forced summed log-probability of each `sequences[j]` (end token included), read
    from image `images[j]`, decoded from `start_ids[j]`.

    `sequences[j]` is in the order the decoder reads it (reversed for a right-to-left start).
    Rows are grouped by image: one `model.decode(..., group=g)` call reads each image's features
    once for all its rows (a transformer then projects and attends to them once per image, not
    once per row; joint search rescores 2 x beam rows an image). Groups are sorted by their
    longest row and decoded in chunks of at most `max_cells` rows x length x feature cells, so
    that each chunk pads only to its own longest row and memory stays bounded; an image whose
    rows alone exceed the budget is split into several groups (at least one row each). A chunk's
    groups are padded to the same number of rows with all-pad rows. Rows are right-padded with
    `pad_id`; with causal self-attention a real position never sees a pad, and pad positions are
    left out of the sum.
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
    """One batched `model.decode(..., group=width)` over `groups` (image, rows), each padded to
    `width` rows; writes the rows' summed log-probabilities into `out`."""
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
