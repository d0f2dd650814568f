"""The training input pipeline: batches collated ahead, targets built on the host, copies that never block.

A step on an H200 takes a few milliseconds, so host work or a blocking copy inside it is idle GPU time.
Each batch is prepared off the step's critical path:

1. collate the images (with the per-batch scale augmentation) and build `tgt_in` / `tgt_out` on the host;
2. on a GPU, pin them, so that
3. `.to(device, non_blocking=True)` queues the copies without waiting for the GPU;
4. with `prefetch > 0`, steps 1-3 run `prefetch` batches ahead in one background thread.

Augmentation draws happen in batch order whichever thread runs them: prefetching changes no number.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ..data import Batch, Expression, RenderConfig, Vocab, collate
from ..data.augment import AugmentConfig, augmented_image
from ..data.batching import NO_LADDER, PadLadder
from ..model.decoder_base import make_targets


@dataclass
class TrainBatch:
    """A collated batch on its device, with its targets ([B', L], B' = 2B for `bi`)."""

    batch: Batch
    tgt_in: Tensor
    tgt_out: Tensor

    def __len__(self) -> int:
        return len(self.batch)


def auto_prefetch(prefetch: int, device: torch.device) -> int:
    """`data.prefetch` -1: 2 batches ahead on a GPU, none on a CPU (the thread would take a core from the step)."""
    if prefetch >= 0:
        return prefetch
    return 2 if device.type == "cuda" else 0


def make_train_batch(exprs: Sequence[Expression], vocab: Vocab, direction: str, device: torch.device,
                     scale: float | None = None, channels_last: bool = False,
                     ladder: PadLadder = NO_LADDER) -> TrainBatch:
    """Steps 1-3 of the module docstring for one batch (`ladder`: `data.pad_multiple`, `data.pad_growth`)."""
    batch = collate(exprs, vocab, scale=scale, ladder=ladder)
    tgt_in, tgt_out, _ = make_targets(batch.token_ids, direction, vocab)
    if device.type == "cuda":
        batch = batch.pin_memory()
        tgt_in, tgt_out = tgt_in.pin_memory(), tgt_out.pin_memory()
    batch = batch.to(device, non_blocking=True)
    if channels_last:
        batch.images = batch.images.contiguous(memory_format=torch.channels_last)
    return TrainBatch(batch, tgt_in.to(device, non_blocking=True), tgt_out.to(device, non_blocking=True))


def train_batches(exprs: Sequence[Expression], batches: Iterable[Sequence[int]], vocab: Vocab, direction: str,
                  device: torch.device, *, scale_range: tuple[float, float] | None = None,
                  rng: np.random.Generator | None = None, prefetch: int = 0,
                  channels_last: bool = False, redraw: "Redraw | None" = None,
                  ladder: PadLadder = NO_LADDER) -> Generator[TrainBatch, None, None]:
    """The batches of one epoch, in the order given, ready for the step.

    scale_range: (min, max) of the per-batch scale (CoMER: 0.7, 1.4), drawn from `rng` in batch order; None or
    max <= 0: off. redraw: the renderer augmentation (`data.aug_*`), from its own generator, in batch order.
    """
    augment = scale_range is not None and scale_range[1] > 0
    if augment and rng is None:
        raise ValueError("scale augmentation needs an rng")

    def make(idx: Sequence[int]) -> TrainBatch:
        scale = None
        if augment and rng is not None and scale_range is not None:  # (augment has both: checked above)
            scale = float(rng.uniform(*scale_range))
        chosen = [exprs[i] for i in idx]
        if redraw is not None:
            chosen = redraw.apply(chosen)
        return make_train_batch(chosen, vocab, direction, device, scale, channels_last, ladder)

    return prefetched(make, iter(batches), prefetch)


@dataclass
class Redraw:
    """Renderer augmentation for training batches (`hmer.data.augment`): each expression is drawn
    again from `strokes[name]` with probability `aug.share`, with draws from `rng`."""

    strokes: dict[str, list[np.ndarray]]
    render_cfg: RenderConfig
    aug: AugmentConfig
    rng: np.random.Generator

    def apply(self, exprs: Sequence[Expression]) -> list[Expression]:
        out = []
        for e in exprs:
            # one draw per expression whatever the outcome, and a fixed number inside augmented_image
            if self.rng.random() < self.aug.share:
                e = Expression(name=e.name, tokens=e.tokens,
                               image=augmented_image(self.strokes[e.name], self.render_cfg, self.aug, self.rng))
            out.append(e)
        return out


def prefetched(make: Callable[[Sequence[int]], Any], order: Iterator[Sequence[int]],
               depth: int) -> Generator[Any, None, None]:
    """make(idx) for each idx of `order`, `depth` items ahead in one background thread (0: in the caller's).
    An exception in `make` is raised in the consumer; closing the iterator early stops the thread."""
    if depth <= 0:
        for idx in order:
            yield make(idx)
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
        try:
            for idx in order:
                if stop.is_set():
                    return
                q.put(make(idx))
        except BaseException as exc:
            q.put(exc)
        q.put(None)

    thread = threading.Thread(target=work, daemon=True, name="hmer-prefetch")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # let the worker see `stop` rather than block on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(0.05)
