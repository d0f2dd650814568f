"""What every search returns, the one length-normalisation rule they share, and small helpers.

Length normalisation (BTTR's convention, `bttr/lit_bttr.py` + `bttr/utils.py`): a finished
hypothesis with `n` tokens (start and end excluded) and summed log-probability `log_prob`
(the end token's log-probability included) scores

    score = log_prob / max(n, 1) ** alpha

`alpha` is the length penalty (1.0: mean log-probability per output token; 0.0: the raw
sum). BTTR applies it to the final choice only; we apply the same formula when a hypothesis
finishes, so a beam's n-best list is ranked by the very score that picks the answer. CoMER
divides by n + 1 instead (it counts the start token); with alpha = 1 the two rank almost
always alike, and one convention for every search keeps l2r, r2l and joint numbers comparable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, Union

import torch
from torch import Tensor

# An id for every image, or one id for all of them.
TokenIds = Union[int, Sequence[int], Tensor]


class SearchDecoder(Protocol):
    """The incremental interface a search calls on `model.decoder` (`hmer.model.Decoder`)."""

    def init_state(self, feats: Tensor, feat_mask: Tensor) -> Any: ...
    def step(self, state: Any, tokens: Tensor) -> tuple[Tensor, Any]: ...
    def reorder_state(self, state: Any, index: Tensor, group: int = 0) -> Any: ...


class SearchModel(Protocol):
    """What a search reads of the model (an `HMERModel`, which decoding does not import). The
    searches take a `torch.nn.Module`, whose attributes the checker sees as `Tensor | Module`;
    they read it through this."""

    @property
    def decoder(self) -> SearchDecoder: ...
    def encode(self, images: Tensor, image_mask: Tensor) -> tuple[Tensor, Tensor]: ...


@dataclass
class Hypothesis:
    """A finished (or, at max_len, closed) decoding hypothesis.

    tokens:   symbol ids without start/end: in decoding order from `beam_search` (so reversed
              for a right-to-left search), in left-to-right order from `joint_beam_search`.
    score:    length-normalised, `log_prob / max(len(tokens), 1) ** alpha`; higher is better.
    log_prob: summed log-probability of the tokens and of the end token.
    """

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
    """Logits in float32, or in float64 if they are: log-probs are summed over up to max_len
    steps, which bf16/fp16 (autocast) would round badly."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))
