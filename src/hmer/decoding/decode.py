"""`decode_batch`: the one entry point of training, evaluation, the CLI and the benchmarks, so
every number comes from the same decoding. Beam searches are looked up by `train.search_rule` in
hmer.registry.SEARCH_RULES: `hmer` here, BTTR's and CoMER's in `reference_search`; beam size 1 is
`greedy_search`, batched on the decoder's incremental interface: an image's rows leave the decoder
state at its end token, so a batch costs what its running images cost.

`joint_beam_search`, the `hmer` rule's search for `bi`, is BTTR's bidirectional approximate joint
search (`bttr/model/decoder.py` `beam_search` + `_cross_rate_score`, `bttr/lit_bttr.py`), for one
decoder trained l2r (`<sos>` to `<eos>`) and r2l:

1. beam search in both directions, batched over 2B rows (every image's l2r rows, then its r2l
   rows) as CoMER does, so the directions share every step;
2. each finished hypothesis is rescored by the opposite direction with teacher forcing, its end
   token included (BTTR's `to_tgt_output` puts the stop token in the target);
3. joint score = (own + opposite log-prob) / max(len, 1) ** alpha: BTTR adds the raw sums and
   normalises once;
4. the best joint score wins (ties: l2r before r2l, then the beam's order).
"""

from __future__ import annotations

from typing import Sequence, cast

import torch
from torch import Tensor

from ..config import DIRECTIONS
from ..registry import SEARCH_RULES
from .beam import NEG_INF, Hypothesis, SearchModel, at_least_float32, beam_search, check_search_args, length_normalized


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
