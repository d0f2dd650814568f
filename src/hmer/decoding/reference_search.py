"""The beam searches of BTTR and CoMER, rule for rule (`train.search_rule = bttr | comer`).

They differ from the project's `hmer` rule (hmer.decoding.beam and .joint) and from each
other in ways that change the chosen hypothesis even with equal logits:

                          hmer                 bttr (43cabd4)           comer (ee15cdb)
  pad / start tokens      never extend         ordinary tokens          ordinary tokens
  live beam               refilled to k        shrinks by each finish   refilled to k (Hugging Face)
  stops when              answer is settled    k finished, or max_len   HF early_stopping=False test
  tokens at most          max_len (closed      max_len (then the first  max_len - 1 (open beams kept
                          with <eos>)          live one, no <eos>)      without an <eos> score)
  finished score          sum / n^a            sum (raw)                sum / (n+1)^a
  joint score             (own + other)/n^a    (own + other)/max(n,1)^a own/(n+1)^a + other/(n+1)^a
  (own, other: summed log-probabilities, the stop token included; n tokens without start/stop)

As both references, we run the decoder over the whole prefix at every step (pad keys masked),
slower than the incremental `hmer` search but the same function, in float32; one image and one
direction at a time, as BTTR (CoMER's batched rows are independent: the same results). A one-way
model gets that direction's search and the final normalisation, without the rescoring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ..registry import SEARCH_RULES
from .beam import at_least_float32


@dataclass
class ReferenceHypothesis:
    """tokens left to right without start/stop; score, rev_score (the opposite direction's) and
    total (what the final choice compares) as in the module's table."""

    tokens: list[int]
    direction: str
    score: float
    rev_score: float = 0.0
    total: float = 0.0


@dataclass
class ReferenceSearchResult:
    """One image: each direction's hypotheses in the reference's order, and the chosen one's index
    into `l2r + r2l`."""

    l2r: list[ReferenceHypothesis] = field(default_factory=list)
    r2l: list[ReferenceHypothesis] = field(default_factory=list)
    best_index: int = 0

    @property
    def best(self) -> ReferenceHypothesis:
        return (self.l2r + self.r2l)[self.best_index]


# ---- the decoder, as the references call it --------------------------------------------------

def next_log_probs(model, feats: Tensor, mask: Tensor, prefixes: list[list[int]], pad_id: int) -> Tensor:
    """[n, V] float32 log-probabilities of the token after each prefix (equal lengths, start
    first), teacher forcing the whole prefix with pad keys masked; feats [1, h, w, d]."""
    tgt = torch.tensor(prefixes, dtype=torch.long, device=feats.device)
    logits = model.decode(feats, mask, tgt, tgt == pad_id)[:, -1]
    return F.log_softmax(at_least_float32(logits), dim=-1)


def sequence_scores(model, feats: Tensor, mask: Tensor, seqs: list[list[int]], start: int, stop: int,
                    pad_id: int) -> tuple[list[float], list[int]]:
    """Per sequence (in reading order): the summed log-probability of its tokens and `stop` (pad
    targets left out, as cross-entropy's ignore_index), and its non-pad input tokens (start included)."""
    if not seqs:
        return [], []
    length = max(len(s) for s in seqs) + 1
    tgt_in = [[start] + s + [pad_id] * (length - 1 - len(s)) for s in seqs]
    tgt_out = [s + [stop] + [pad_id] * (length - 1 - len(s)) for s in seqs]
    tgt = torch.tensor(tgt_in, dtype=torch.long, device=feats.device)
    out = torch.tensor(tgt_out, dtype=torch.long, device=feats.device)
    logits = model.decode(feats, mask, tgt, tgt == pad_id)
    logp = F.log_softmax(at_least_float32(logits), dim=-1).gather(2, out.unsqueeze(2)).squeeze(2)
    sums = logp.masked_fill(out == pad_id, 0.0).sum(dim=1)
    return sums.tolist(), (tgt != pad_id).sum(dim=1).tolist()


# ---- BTTR -----------------------------------------------------------------------------------

def bttr_direction(model, feats, mask, start: int, stop: int, beam_size: int, max_len: int,
                   pad_id: int) -> list[tuple[list[int], float]]:
    """BTTR's `Decoder._beam_search`: (tokens in decoding order, summed log-prob incl. stop) in
    completion order; the live beam shrinks with every finished hypothesis. (No `alpha`: BTTR
    normalises the final choice only.)"""
    hyps: list[list[int]] = [[start]]
    scores = torch.zeros(1, dtype=torch.float32, device=feats.device)
    completed: list[tuple[list[int], float]] = []
    t = 0
    while len(completed) < beam_size and t < max_len:
        logp = next_log_probs(model, feats, mask, hyps, pad_id)
        vocab = logp.shape[-1]
        top_scores, top_pos = torch.topk((scores[:, None] + logp).reshape(-1), k=beam_size - len(completed))
        t += 1
        new_hyps, new_scores = [], []
        for score, pos in zip(top_scores.tolist(), top_pos.tolist()):
            prev, token = divmod(pos, vocab)
            if token == stop:
                completed.append((hyps[prev][1:], score))
            else:
                new_hyps.append(hyps[prev] + [token])
                new_scores.append(score)
        if len(completed) == beam_size:
            break
        hyps = new_hyps
        scores = torch.tensor(new_scores, dtype=torch.float32, device=feats.device)
    if not completed:  # max_len reached: the first live hypothesis, without a stop token
        completed.append((hyps[0][1:], float(scores[0])))
    return completed


# ---- CoMER ----------------------------------------------------------------------------------

class _CoMERHypotheses:
    """CoMER's (Hugging Face's) `BeamHypotheses`: the n best, in insertion order, the worst deleted."""

    def __init__(self, beam_size: int, alpha: float):
        self.beam_size, self.alpha = beam_size, alpha
        self.beams: list[tuple[float, list[int]]] = []
        self.worst_score = 1e9

    def add(self, prefix: list[int], sum_logprobs: float) -> None:
        score = sum_logprobs / (len(prefix) ** self.alpha)
        if len(self.beams) < self.beam_size or score > self.worst_score:
            self.beams.append((score, prefix))
            if len(self.beams) > self.beam_size:
                ranked = sorted((s, i) for i, (s, _) in enumerate(self.beams))
                del self.beams[ranked[0][1]]
                self.worst_score = ranked[1][0]
            else:
                self.worst_score = min(score, self.worst_score)

    def is_done(self, best_sum_logprobs: float, cur_len: int) -> bool:
        if len(self.beams) < self.beam_size:
            return False
        return self.worst_score >= best_sum_logprobs / cur_len ** self.alpha


def comer_direction(model, feats, mask, start: int, stop: int, beam_size: int, max_len: int, alpha: float,
                    pad_id: int) -> list[tuple[list[int], float]]:
    """CoMER's `_beam_search` with its `BeamSearchScorer`: (tokens in decoding order, score)."""
    prefixes: list[list[int]] = [[start]]
    beam_scores = torch.zeros(1, dtype=torch.float32, device=feats.device)
    finished = _CoMERHypotheses(beam_size, alpha)
    done = False
    cur_len = 1
    while cur_len < max_len and not done:
        logp = next_log_probs(model, feats, mask, prefixes, pad_id)
        vocab = logp.shape[-1]
        top_scores, top_pos = torch.topk((logp + beam_scores[:, None]).reshape(-1), 2 * beam_size)
        new_prefixes, new_scores = [], []
        for rank, (score, pos) in enumerate(zip(top_scores.tolist(), top_pos.tolist())):
            beam, token = divmod(pos, vocab)
            if token == stop:
                if rank < beam_size:  # an end beyond the first k candidates does not count
                    finished.add(prefixes[beam], score)
            else:
                new_prefixes.append(prefixes[beam] + [token])
                new_scores.append(score)
            if len(new_prefixes) == beam_size:
                break
        done = finished.is_done(max(new_scores), cur_len=len(prefixes[0]))
        prefixes = new_prefixes
        beam_scores = torch.tensor(new_scores, dtype=torch.float32, device=feats.device)
        cur_len += 1
    if not done:  # open beams join as they are, without a stop token
        for prefix, score in zip(prefixes, beam_scores.tolist()):
            finished.add(prefix, score)
    return [(prefix[1:], score) for score, prefix in finished.beams]


# ---- either, for one image and for a batch ------------------------------------------------------

def search_one_image(model, feats, mask, rule: str, direction: str, sos_id: int, eos_id: int, beam_size: int,
                     max_len: int, alpha: float, pad_id: int = 0) -> ReferenceSearchResult:
    """BTTR's `beam_search` + `_cross_rate_score` + `LitBTTR`'s choice, or CoMER's `beam_search`
    (`approximate_joint_search`), for one image; the scores as in the module's table."""
    comer = rule == "comer"
    result = ReferenceSearchResult()
    for side in ("l2r", "r2l") if direction == "bi" else (direction,):
        start, stop = (sos_id, eos_id) if side == "l2r" else (eos_id, sos_id)
        found = (comer_direction(model, feats, mask, start, stop, beam_size, max_len, alpha, pad_id) if comer
                 else bttr_direction(model, feats, mask, start, stop, beam_size, max_len, pad_id))
        hyps = [ReferenceHypothesis(toks if side == "l2r" else toks[::-1], side, score) for toks, score in found]
        if direction == "bi":  # rated by the other direction, the sequence in its reading order
            seqs = [h.tokens[::-1] if side == "l2r" else h.tokens for h in hyps]
            sums, counts = sequence_scores(model, feats, mask, seqs, stop, start, pad_id)
            for h, total, count in zip(hyps, sums, counts):
                h.rev_score = total / (count ** alpha) if comer else total
        for h in hyps:
            h.total = h.score + h.rev_score if comer else (h.score + h.rev_score) / (max(len(h.tokens), 1) ** alpha)
        getattr(result, side).extend(hyps)
    totals = [h.total for h in result.l2r + result.r2l]
    result.best_index = max(range(len(totals)), key=totals.__getitem__, default=0)  # ties: the earlier one
    return result


@torch.inference_mode()
def reference_decode(model, feats: Tensor, mask: Tensor, rule: str, direction: str, sos_id: int, eos_id: int,
                     beam_size: int, max_len: int, alpha: float, pad_id: int = 0) -> list[ReferenceSearchResult]:
    """`rule`'s search for every image of encoded features feats [B, h, w, d] / mask [B, h, w]."""
    if rule not in ("bttr", "comer"):
        raise ValueError(f"search rule {rule!r} is not one of bttr, comer")
    return [search_one_image(model, feats[i:i + 1], mask[i:i + 1], rule, direction, sos_id, eos_id, beam_size,
                             max_len, float(alpha), pad_id) for i in range(feats.shape[0])]


def _best_tokens(rule: str):
    """`rule`'s search as a registered beam search rule: the chosen hypothesis of each image."""
    def search(model, feats: Tensor, mask: Tensor, direction: str, *, beam_size: int, max_len: int,
               length_penalty: float, sos_id: int, eos_id: int, pad_id: int) -> list[list[int]]:
        results = reference_decode(model, feats, mask, rule, direction, sos_id, eos_id, beam_size, max_len,
                                   length_penalty, pad_id=pad_id)
        return [r.best.tokens for r in results]  # already left to right

    return search


SEARCH_RULES.register("bttr", _best_tokens("bttr"),
                      description="BTTR's own beam search (43cabd4), rule for rule; one image at a time")
SEARCH_RULES.register("comer", _best_tokens("comer"),
                      description="CoMER's own beam search (ee15cdb), rule for rule; one image at a time")
