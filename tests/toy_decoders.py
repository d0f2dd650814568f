"""Toy models implementing the decoding interface, whose distributions are known exactly.

A toy model's next-token distribution is a plain function of (image key, prefix), where the
prefix starts with the start token and the image key is a number computed from the image's
*unpadded* region (so padding the image inside a batch cannot change it). They provide

    feats, mask = model.encode(images, image_mask)          # feats [B, H, W, 1]: the pixels
    state = model.decoder.init_state(feats, mask)
    logits, state = model.decoder.step(state, tokens)       # [N, V]
    state = model.decoder.reorder_state(state, index)
    logits = model.decode(feats, mask, tgt_in)              # [N, L, V], teacher forcing

plus `log_probs(prefix, key)` and brute-force enumeration helpers, to compute expected answers.
Ids follow the project: pad 0, sos 1, eos 2, symbols from 3.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor

PAD, SOS, EOS = 0, 1, 2


@dataclass
class ToyState:
    prefix: Tensor  # long [N, t + 1]: start token and the tokens fed so far
    key: Tensor  # float64 [N]: the image key of each row


class ToyModel:
    """Base class: subclasses define `log_probs(prefix, key) -> float64 [V]`."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.decoder = self  # the incremental interface lives on the same object
        self.rows_per_step: list[int] = []  # rows fed at each `step` call (to see pruning)

    # ---- the distribution ------------------------------------------------------------------
    def log_probs(self, prefix: tuple[int, ...], key: float) -> Tensor:
        raise NotImplementedError

    # ---- model interface -------------------------------------------------------------------
    def encode(self, images: Tensor, image_mask: Tensor) -> tuple[Tensor, Tensor]:
        return images.permute(0, 2, 3, 1).double(), image_mask

    @staticmethod
    def image_keys(feats: Tensor, mask: Tensor) -> Tensor:
        """A number per image from its unpadded top-left region only."""
        keys = []
        for f, m in zip(feats, mask):
            h = int((~m).any(dim=1).sum())
            w = int((~m).any(dim=0).sum())
            keys.append(float(f[:h, :w].contiguous().sum()) / max(h * w, 1))
        return torch.tensor(keys, dtype=torch.float64)

    def init_state(self, feats: Tensor, mask: Tensor) -> ToyState:
        return ToyState(prefix=torch.zeros((feats.shape[0], 0), dtype=torch.long), key=self.image_keys(feats, mask))

    def step(self, state: ToyState, tokens: Tensor) -> tuple[Tensor, ToyState]:
        prefix = torch.cat([state.prefix, tokens.cpu().view(-1, 1)], dim=1)
        self.rows_per_step.append(prefix.shape[0])
        rows = [self.log_probs(tuple(p), float(k)) for p, k in zip(prefix.tolist(), state.key.tolist())]
        logits = torch.stack(rows) if rows else torch.zeros((0, self.vocab_size), dtype=torch.float64)
        return logits.float().to(tokens.device), ToyState(prefix, state.key)

    def reorder_state(self, state: ToyState, index: Tensor, group: int = 0) -> ToyState:
        # group: beam search's promise that rows are grouped by image; a toy state has no memory to cut.
        index = index.cpu()
        return ToyState(state.prefix.index_select(0, index), state.key.index_select(0, index))

    def decode(self, feats: Tensor, mask: Tensor, tgt_in: Tensor, group: int = 0) -> Tensor:
        keys = self.image_keys(feats, mask).tolist()
        if group:  # row r reads image r // group
            keys = [key for key in keys for _ in range(group)]
        out = torch.zeros((tgt_in.shape[0], tgt_in.shape[1], self.vocab_size))
        for i, (row, key) in enumerate(zip(tgt_in.tolist(), keys)):
            for t in range(len(row)):
                out[i, t] = self.log_probs(tuple(row[: t + 1]), key).float()
        return out

    # ---- exact answers ----------------------------------------------------------------------
    def sequence_log_prob(self, seq: Sequence[int], start: int, end: int, key: float = 0.0) -> float:
        """log p(seq, end | start) in float64, `seq` in decoding order."""
        prefix = (start,)
        total = 0.0
        for tok in list(seq) + [end]:
            total += float(self.log_probs(prefix, key)[tok])
            prefix = prefix + (tok,)
        return total

    def symbols(self) -> list[int]:
        return list(range(3, self.vocab_size))


def all_sequences(symbols: Sequence[int], max_len: int) -> Iterator[tuple[int, ...]]:
    """Every sequence of `symbols` with 0 .. max_len tokens."""
    for n in range(max_len + 1):
        yield from itertools.product(symbols, repeat=n)


def normalized(log_prob: float, length: int, alpha: float) -> float:
    return log_prob / max(length, 1) ** alpha


def brute_force(model: ToyModel, start: int, end: int, max_len: int, alpha: float, key: float = 0.0):
    """All (score, log_prob, seq) sorted best first: the exact answer of a search in one direction."""
    rows = []
    for seq in all_sequences(model.symbols(), max_len):
        lp = model.sequence_log_prob(seq, start, end, key)
        rows.append((normalized(lp, len(seq), alpha), lp, list(seq)))
    rows.sort(key=lambda r: -r[0])
    return rows


def brute_force_joint(model: ToyModel, max_len: int, alpha: float, key: float = 0.0):
    """All (joint score, joint log_prob, seq in l2r order) sorted best first."""
    rows = []
    for seq in all_sequences(model.symbols(), max_len):
        lp = model.sequence_log_prob(seq, SOS, EOS, key) + model.sequence_log_prob(seq[::-1], EOS, SOS, key)
        rows.append((normalized(lp, len(seq), alpha), lp, list(seq)))
    rows.sort(key=lambda r: -r[0])
    return rows


class TableModel(ToyModel):
    """Distributions written out by hand.

    table[prefix] = {token: probability}; a prefix not in the table uses defaults[prefix[0]]
    (one default per start token, so l2r and r2l can differ). The probability left over is
    spread evenly over the non-pad tokens the entry does not name.
    """

    def __init__(self, vocab_size: int, table: dict[tuple[int, ...], dict[int, float]],
                 defaults: dict[int, dict[int, float]]):
        super().__init__(vocab_size)
        self.table = table
        self.defaults = defaults

    def log_probs(self, prefix: tuple[int, ...], key: float) -> Tensor:
        named = self.table.get(tuple(prefix), self.defaults[prefix[0]])
        rest = [tok for tok in range(1, self.vocab_size) if tok not in named]
        left = 1.0 - sum(named.values())
        assert left > 0 and rest, "leave some probability for the unnamed tokens"
        p = torch.full((self.vocab_size,), left / len(rest), dtype=torch.float64)
        p[PAD] = 1e-12
        for tok, prob in named.items():
            p[tok] = prob
        return torch.log(p / p.sum())


class RandomModel(ToyModel):
    """A fixed pseudo-random distribution for every (prefix, image key): deterministic,
    tie-free, and different for every image. `end_bias` is added to both end tokens' logits
    (sos and eos), so a large one gives short sequences and a very negative one none at all."""

    def __init__(self, vocab_size: int, seed: int = 0, sharpness: float = 2.0, image_weight: float = 1.0,
                 end_bias: float = 0.0):
        super().__init__(vocab_size)
        self.seed = seed
        self.sharpness = sharpness
        self.image_weight = image_weight
        self.end_bias = end_bias

    def _noise(self, prefix: tuple[int, ...], salt: int) -> Tensor:
        h = zlib.crc32(repr((self.seed, salt, prefix)).encode())
        return torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(h), dtype=torch.float64)

    def log_probs(self, prefix: tuple[int, ...], key: float) -> Tensor:
        logits = self.sharpness * self._noise(prefix, 0) + self.image_weight * key * self._noise(prefix, 1)
        logits[SOS] += self.end_bias
        logits[EOS] += self.end_bias
        return torch.log_softmax(logits, dim=0)


def padded_batch(sizes: Sequence[tuple[int, int]], seed: int = 0) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]]]:
    """Random images of the given (H, W), zero-padded bottom/right into one batch, and each
    image alone: (images [B, 1, H, W], mask [B, H, W] True = pad, [(image, mask) per image])."""
    g = torch.Generator().manual_seed(seed)
    # Different brightness per image, so that the images' keys (means) differ clearly.
    singles = [torch.rand((1, 1, h, w), generator=g) * (i + 1) / len(sizes) for i, (h, w) in enumerate(sizes)]
    big_h = max(h for h, _ in sizes)
    big_w = max(w for _, w in sizes)
    images = torch.zeros((len(sizes), 1, big_h, big_w))
    mask = torch.ones((len(sizes), big_h, big_w), dtype=torch.bool)
    for i, (img, (h, w)) in enumerate(zip(singles, sizes)):
        images[i, :, :h, :w] = img[0]
        mask[i, :h, :w] = False
    return images, mask, [(img, torch.zeros((1, h, w), dtype=torch.bool)) for img, (h, w) in zip(singles, sizes)]


def key_of(model: ToyModel, image: Tensor, mask: Optional[Tensor] = None) -> float:
    """The key a toy model computes for one unpadded image [1, 1, H, W]."""
    if mask is None:
        mask = torch.zeros(image.shape[0], image.shape[2], image.shape[3], dtype=torch.bool)
    feats, m = model.encode(image, mask)
    return float(model.image_keys(feats, m)[0])


__all__ = [
    "EOS",
    "PAD",
    "SOS",
    "RandomModel",
    "TableModel",
    "ToyModel",
    "all_sequences",
    "brute_force",
    "brute_force_joint",
    "key_of",
    "normalized",
    "padded_batch",
]
