"""Batched beam search: every image and every beam of a batch advance in one decoder step.

Decoder state rows are image-major (row = image * beam_size + beam). Each step, per image:
extend every live hypothesis by every token; take the best `2 * beam_size` candidates in a
stable order (ties: lower beam, then lower token id), so results never depend on the rest of
the batch; an end token ranked within the first `beam_size` finishes into the image's pool
(BTTR's length normalisation, best `beam_size` kept); refill the live beam with the best
non-end candidates (CoMER's / Hugging Face's scheme; BTTR lets the beam shrink); drop the
image's rows once its answer can no longer change (`_image_done`).

A hypothesis reaching `max_len` tokens is closed with its end-token log-probability, so every
score is of one kind. Pad and start tokens never extend a hypothesis (a pad would corrupt
joint search's teacher-forced rescoring); their mass is not renormalised away, so scores stay
the model's own log-probabilities, which teacher forcing reproduces exactly.

`Hypothesis` is what every search returns, `length_normalized` the normalisation they share, BTTR's
(`bttr/lit_bttr.py`, `bttr/utils.py`): `score = log_prob / max(n, 1) ** alpha`, n tokens without
start/end, log_prob including the end token. BTTR applies it to the final choice only; we score each
hypothesis so when it finishes, so the n-best list is ranked by the score that picks the answer.
CoMER divides by n + 1; one convention keeps l2r, r2l and joint numbers comparable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, Union, cast

import torch
from torch import Tensor

NEG_INF = float("-inf")

# An id for every image, or one id for all of them.
TokenIds = Union[int, Sequence[int], Tensor]


class SearchDecoder(Protocol):
    """The incremental interface a search calls on `model.decoder` (`hmer.model.Decoder`)."""

    def init_state(self, feats: Tensor, feat_mask: Tensor) -> Any: ...
    def step(self, state: Any, tokens: Tensor) -> tuple[Tensor, Any]: ...
    def reorder_state(self, state: Any, index: Tensor, group: int = 0) -> Any: ...


class SearchModel(Protocol):
    """What a search reads of the model (an `HMERModel`, which decoding does not import): the
    type checker sees a `torch.nn.Module`'s attributes as `Tensor | Module`."""

    @property
    def decoder(self) -> SearchDecoder: ...
    def encode(self, images: Tensor, image_mask: Tensor) -> tuple[Tensor, Tensor]: ...


@dataclass
class Hypothesis:
    """A finished (or, at max_len, closed) hypothesis: `tokens` without start/end, in decoding
    order from `beam_search`, left to right from `joint_beam_search`; `log_prob` summed with the
    end token's; `score` its `length_normalized` value."""

    tokens: list[int]
    score: float
    log_prob: float

    def __len__(self) -> int:
        return len(self.tokens)


def length_normalized(log_prob: float, length: int, alpha: float) -> float:
    """BTTR's length normalisation; an empty hypothesis counts as length 1 (no division by 0)."""
    return log_prob / (max(length, 1) ** alpha)


def per_image_ids(ids: TokenIds, batch: int, device: torch.device) -> Tensor:
    """`ids` as a long tensor [batch]: an int is broadcast, a sequence must have one id per image."""
    if isinstance(ids, int):
        return torch.full((batch,), ids, dtype=torch.long, device=device)
    out = torch.as_tensor(ids, dtype=torch.long, device=device).reshape(-1)
    if out.shape[0] != batch:
        raise ValueError(f"{out.shape[0]} token ids for {batch} images: give one id per image, or an int")
    return out


def check_search_args(beam_size: int, max_len: int) -> None:
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size} must be at least 1")
    if max_len < 0:
        raise ValueError(f"max_len={max_len} must not be negative")


def at_least_float32(logits: Tensor) -> Tensor:
    """Logits in at least float32: log-probs summed over max_len steps would round badly in bf16/fp16."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


@torch.inference_mode()
def beam_search(model: torch.nn.Module, feats: Tensor, mask: Tensor, start_id: TokenIds, end_id: TokenIds,
                beam_size: int = 10, max_len: int = 200, length_penalty: float = 1.0, *, pad_id: int = 0,
                exhaustive: bool = False) -> list[list[Hypothesis]]:
    """Up to `beam_size` finished hypotheses per image, best first (tokens in decoding order).

    feats [B, h, w, d], mask [B, h, w] (True = pad) from `model.encode`; start_id, end_id: an
    int, or one per image (joint search runs l2r and r2l rows together). `exhaustive` keeps only
    `_image_done`'s exact rule: the best the beam can reach, at the price of decoding longer.
    One image's hypotheses are the same in any batch, as long as the model's rows are independent.
    """
    check_search_args(beam_size, max_len)
    batch = feats.shape[0]
    if batch == 0:
        return []
    decoder = cast(SearchModel, model).decoder
    device = feats.device
    k = beam_size
    alpha = float(length_penalty)
    starts = per_image_ids(start_id, batch, device)
    ends = per_image_ids(end_id, batch, device)

    # Expand to image-major rows; only beam 0 is alive at first (the others would be copies).
    state = decoder.init_state(feats, mask)
    state = decoder.reorder_state(state, torch.arange(batch, device=device).repeat_interleave(k), group=k)
    active = list(range(batch))  # original image of each image still decoding (host side)
    scores = torch.full((batch, k), NEG_INF, device=device)  # summed log-probs of live hypotheses
    scores[:, 0] = 0.0
    history = torch.zeros((batch, k, 0), dtype=torch.long, device=device)  # their tokens so far
    prev = starts.repeat_interleave(k)
    pools: list[list[Hypothesis]] = [[] for _ in range(batch)]

    for t in range(max_len + 1):  # at step t the live hypotheses hold t tokens
        n = len(active)
        logits, state = decoder.step(state, prev)
        logp = torch.log_softmax(at_least_float32(logits), dim=-1)
        vocab = logp.shape[-1]
        logp = logp.view(n, k, vocab)
        logp[:, :, pad_id] = NEG_INF
        logp.scatter_(2, starts.view(n, 1, 1).expand(n, k, 1), NEG_INF)

        if t == max_len:  # every hypothesis still live is closed with its end token
            end_logp = logp.gather(2, ends.view(n, 1, 1).expand(n, k, 1)).squeeze(2)
            closed = (scores + end_logp).tolist()
            tokens = history.tolist()
            for a, image in enumerate(active):
                for lp, toks in zip(closed[a], tokens[a]):
                    if lp > NEG_INF:
                        _add(pools[image], Hypothesis(toks, length_normalized(lp, max_len, alpha), lp), k)
            break

        cand = (scores.unsqueeze(2) + logp).view(n, k * vocab)
        width = min(2 * k, k * vocab)
        # A stable full sort rather than topk: topk's order among equal scores is unspecified.
        top_scores, top_idx = torch.sort(cand, dim=1, descending=True, stable=True)
        top_scores, top_idx = top_scores[:, :width], top_idx[:, :width]
        src_beam = torch.div(top_idx, vocab, rounding_mode="floor")
        token = top_idx - src_beam * vocab
        finite = torch.isfinite(top_scores)
        is_end = token == ends.unsqueeze(1)
        rank = torch.arange(width, device=device)
        # An end candidate counts only where a plain top-k beam would have kept it (rank < k).
        finishing = is_end & finite & (rank < k)
        extendable = ~is_end & finite
        # The first k extendable candidates, in rank order (at most k of the 2k are end tokens).
        order = (~extendable).long().argsort(dim=1, stable=True)[:, :k]
        new_scores = torch.where(extendable.gather(1, order), top_scores.gather(1, order), NEG_INF)
        new_beam = src_beam.gather(1, order)
        new_token = token.gather(1, order)

        if bool(finishing.any()):  # host sync; finished hypotheses are few per step
            a_idx, r_idx = finishing.nonzero(as_tuple=True)
            fin_logp = top_scores[a_idx, r_idx].tolist()
            fin_tokens = history[a_idx, src_beam[a_idx, r_idx]].tolist()
            for a, lp, toks in zip(a_idx.tolist(), fin_logp, fin_tokens):
                _add(pools[active[a]], Hypothesis(toks, length_normalized(lp, t, alpha), lp), k)

        best_live = new_scores.max(dim=1).values.tolist()
        keep = [a for a in range(n)
                if not _image_done(pools[active[a]], best_live[a], t + 1, k, max_len, alpha, exhaustive)]
        if not keep:
            break
        keep_t = torch.tensor(keep, dtype=torch.long, device=device)
        # Rows of the next state: each kept image's surviving beams, in one reorder.
        rows = (keep_t.unsqueeze(1) * k + new_beam[keep_t]).view(-1)
        state = decoder.reorder_state(state, rows, group=k)
        history = torch.cat([history.view(n * k, t)[rows].view(len(keep), k, t), new_token[keep_t].unsqueeze(2)], dim=2)
        scores = new_scores[keep_t]
        prev = new_token[keep_t].view(-1)
        starts, ends = starts[keep_t], ends[keep_t]
        active = [active[a] for a in keep]

    for pool in pools:
        if not pool:  # only a model that gives every token -inf gets here
            pool.append(Hypothesis([], NEG_INF, NEG_INF))
    return pools


def _add(pool: list[Hypothesis], hyp: Hypothesis, capacity: int) -> None:
    """Insert keeping the pool best first (stable: ties keep the earlier one), `capacity` long."""
    pool.append(hyp)
    pool.sort(key=lambda h: -h.score)
    del pool[capacity:]


def _image_done(pool: list[Hypothesis], best_live: float, live_len: int, beam_size: int, max_len: int, alpha: float,
                exhaustive: bool) -> bool:
    """Whether to stop decoding this image. Exact rule (always on): no continuation of a live
    hypothesis can beat the pool's best. Default rule (off when `exhaustive`): the pool is full and
    the best live one, at its current length, ranks below its worst (Hugging Face's
    `early_stopping=False`, as BTTR and CoMER). Not "`beam_size` finished": short junk ending first
    would cost a model sure of a long answer that answer.
    """
    if best_live == NEG_INF:  # nothing left to extend
        return True
    if not pool:
        return False
    if not exhaustive and len(pool) >= beam_size and length_normalized(best_live, live_len, alpha) <= pool[-1].score:
        return True
    # Log-probs are <= 0, so the sum can only fall; the normalised score is monotonic in the
    # length, in [live_len, max_len], so one end bounds any continuation.
    bound = max(length_normalized(best_live, live_len, alpha), length_normalized(best_live, max_len, alpha))
    return bound <= pool[0].score
