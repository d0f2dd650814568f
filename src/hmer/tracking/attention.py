"""Where a model looks for each token it reads: per-token attention (or coverage) over the image.

    model, cfg, vocab = hmer.tracking.load_model(run_id)
    result = attend(model, vocab, expr, tokens=predicted_tokens, label="coverage=cross")
    fig = hmer.reports.plots.plot_attention([result_with, result_without])   # one row block per model

The maps come from `model.attention_maps` with teacher forcing on the given tokens (the
tokens the model decoded, read from its predictions CSV, or decoded here): row t is
where the decoder looked to emit token t. With `kind="coverage"` they are the coverage
instead, the sum of the attention of the steps before t. Maps are upsampled from the
feature grid to the image and returned in reading order (for a right-to-left model the
rows are flipped back).

Over-parsing (a stroke read twice) shows as ink attended by several tokens, i.e. a
summed attention above 1 there; under-parsing (a stroke never read) as ink the summed
attention leaves dark. `AttentionResult.total` is that sum, and `parse_error` names the
case from the lengths of prediction and truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

# The maps themselves are computed where a run's logged pictures are drawn from them too.
from .artifacts import KINDS, token_maps

__all__ = ["KINDS", "AttentionResult", "attend", "decode_tokens", "token_maps"]


@dataclass
class AttentionResult:
    """The per-token maps of one model on one expression.

    Attributes:
        label: the model's name in a figure ("with coverage", a variant, a run id).
        name: the expression's name.
        image: float [H, W] in [0, 1], white ink on black.
        tokens: the tokens the maps belong to, in reading order.
        maps: float [len(tokens), H, W], upsampled to the image: each pixel holds the
            attention weight of its feature cell (see `token_maps`).
        truth: the ground-truth tokens, when known.
        kind: "attention" or "coverage".
        forced: the tokens are the truth, teacher-forced (not what the model read).
    """

    label: str
    name: str
    image: np.ndarray
    tokens: list[str]
    maps: np.ndarray
    truth: list[str] | None = None
    kind: str = "attention"
    forced: bool = False

    @property
    def total(self) -> np.ndarray:
        """[H, W]: the attention summed over every token (how often each place was read)."""
        if not len(self.tokens):
            return np.zeros_like(self.image)
        return self.maps.sum(axis=0)

    @property
    def distance(self) -> int | None:
        """Edit distance of the tokens to the truth (None without a truth)."""
        if self.truth is None:
            return None
        import editdistance

        return int(editdistance.eval(self.tokens, self.truth))

    @property
    def parse_error(self) -> str:
        """"correct", "over-parsed" (more tokens than the truth), "under-parsed" (fewer),
        "misread" (as many, some wrong), or "" without a truth or when the truth was forced."""
        if self.truth is None or self.forced:
            return ""
        if self.tokens == self.truth:
            return "correct"
        if len(self.tokens) > len(self.truth):
            return "over-parsed"
        if len(self.tokens) < len(self.truth):
            return "under-parsed"
        return "misread"


def decode_tokens(model: Any, cfg: Any, vocab: Any, image: np.ndarray, *, device: str | torch.device = "cpu",
                  beam_size: int | None = None) -> list[str]:
    """What the model reads in `image`, with the decoding its run was scored with (beam from cfg)."""
    from ..data import Expression
    from ..device import autocast_dtype
    from ..evaluation.evaluate import decode_options, predict

    device = torch.device(device)
    preds, _ = predict(model, [Expression(name="", tokens=[], image=image)], vocab,
                       **decode_options(cfg, device, autocast_dtype(cfg.train.precision, device), beam=beam_size))
    return preds[0]


def attend(model: Any, vocab: Any, expr: Any, *, tokens: Sequence[str] | None = None, label: str = "",
           cfg: Any = None, kind: str = "attention", device: str | torch.device = "cpu") -> AttentionResult:
    """The `AttentionResult` of `model` on an `Expression`.

    `tokens`: what the model read (e.g. from its predictions CSV); decoded here with
    `cfg` when None.
    """
    if tokens is None:
        if cfg is None:
            raise ValueError("give the decoded tokens, or the model's cfg to decode them")
        tokens = decode_tokens(model, cfg, vocab, expr.image, device=device)
    tokens = [t for t in tokens if t in vocab]
    maps = token_maps(model, vocab, expr.image, tokens, kind=kind, device=device)
    return AttentionResult(label=label, name=expr.name, image=expr.image.astype(np.float32) / 255.0,
                           tokens=list(tokens), maps=maps, truth=list(expr.tokens) if expr.tokens else None,
                           kind=kind)
