"""Decode a split with a model and score it: the one path shared by training, `hmer evaluate`
and the studies, so a number in a table always means the same thing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from ..data import Expression, Vocab, collate, make_batches
from ..data.batching import NO_LADDER, PadLadder
from ..decoding import decode_batch
from .metrics import Scores, expression_metrics


@dataclass
class SplitResult:
    scores: Scores
    names: list[str]
    truths: list[list[str]]
    predictions: list[list[str]]
    resized: int  # evaluation images shrunk to fit max_image_pixels (never dropped)

    def rows(self) -> list[dict[str, object]]:
        """Rows of the predictions CSV: name, truth, prediction, distance."""
        return [{"name": n, "truth": " ".join(t), "prediction": " ".join(p), "distance": d}
                for n, t, p, d in zip(self.names, self.truths, self.predictions, self.scores.distances)]


def decode_options(cfg, device: torch.device, autocast_dtype: torch.dtype | None, beam: int | None = None,
                   progress: str | None = None) -> dict[str, Any]:
    """The keyword arguments of `predict` / `evaluate_split` for a run's `Config` (its decoding, beam
    size unless `beam` is given, and evaluation batching): training and the CLI all decode this way."""
    return dict(direction=cfg.model.direction, device=device, beam_size=cfg.train.beam_size if beam is None else beam,
                max_len=cfg.train.max_decode_len, length_penalty=cfg.train.length_penalty,
                search_rule=cfg.train.search_rule,
                batch_pixels=cfg.data.eval_batch_pixels, max_batch_size=cfg.data.eval_max_batch_size,
                max_image_pixels=cfg.data.max_image_pixels, ladder=PadLadder.from_data_config(cfg.data),
                autocast_dtype=autocast_dtype, progress=progress)


@torch.inference_mode()
def predict(model: torch.nn.Module, exprs: Sequence[Expression], vocab: Vocab, *, direction: str, device: torch.device,
            beam_size: int = 10, max_len: int = 200, length_penalty: float = 1.0, search_rule: str = "hmer",
            batch_pixels: int = 1_600_000, max_batch_size: int = 64, max_image_pixels: int = 400_000,
            ladder: PadLadder = NO_LADDER, autocast_dtype: torch.dtype | None = None,
            progress: str | None = None) -> tuple[list[list[str]], int]:
    """Predicted token sequences in the order of `exprs`, and the count of resized images."""
    model.eval()
    batches = make_batches(exprs, batch_pixels, max_batch_size, shuffle=False, seed=0,
                           max_image_pixels=max_image_pixels)
    predictions: list[list[str]] = [[] for _ in exprs]  # (every expression is in one batch)
    resized = 0
    for idx in tqdm(batches, desc=progress, unit="batch", leave=False, disable=not progress):
        batch = collate([exprs[i] for i in idx], vocab, max_pixels=max_image_pixels, ladder=ladder).to(device)
        resized += batch.resized
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            hyps = decode_batch(model, batch.images, batch.image_mask, direction,
                                beam_size=beam_size, max_len=max_len, length_penalty=length_penalty,
                                sos_id=vocab.sos_id, eos_id=vocab.eos_id, search_rule=search_rule)
        for i, ids in zip(idx, hyps):
            predictions[i] = vocab.decode(ids)
    return predictions, resized


def evaluate_split(model, exprs: Sequence[Expression], vocab: Vocab, **kwargs) -> SplitResult:
    """Decode every expression of a split and score it against its caption."""
    preds, resized = predict(model, exprs, vocab, **kwargs)
    truths = [list(e.tokens) for e in exprs]
    scores = expression_metrics(preds, truths)
    return SplitResult(scores, [e.name for e in exprs], truths, preds, resized)
