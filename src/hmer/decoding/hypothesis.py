"""What every search returns, the length normalisation they share, and small helpers.

BTTR's normalisation (`bttr/lit_bttr.py`, `bttr/utils.py`): `score = log_prob / max(n, 1) ** alpha`,
n tokens without start/end, log_prob including the end token. BTTR applies it to the final choice
only; we score each hypothesis so when it finishes, so the n-best list is ranked by the score that
picks the answer. CoMER divides by n + 1; one convention keeps l2r, r2l and joint numbers comparable.
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
