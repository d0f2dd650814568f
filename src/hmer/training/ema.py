"""An exponential moving average of a model's weights (`train.ema_decay`): what validation scores and a run keeps.

After each optimiser step, `average = d * average + (1 - d) * weight` with `d = min(ema_decay, (1 + n) / (10 + n))`
after n updates, so the random initial weights do not dominate the first averages (TensorFlow's
`ExponentialMovingAverage(num_updates=...)`). Buffers (BatchNorm statistics) are not averaged: the model's own
are used, as timm's `ModelEmaV3` can. Off by default, so nothing trained before it changes.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch


class WeightAverage:
    """The average of `model`'s floating-point parameters, updated with `update` after each step."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.updates = 0
        self.names = [name for name, p in model.named_parameters() if p.dtype.is_floating_point]
        self.average = [p.clone() for p in self._params(model)]

    def _params(self, model: torch.nn.Module) -> list[torch.Tensor]:
        params = dict(model.named_parameters())
        return [params[name].detach() for name in self.names]

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        weight = 1.0 - min(self.decay, (1 + self.updates) / (10 + self.updates))
        for average, param in zip(self.average, self._params(model)):
            average.lerp_(param, weight)

    @contextmanager
    def swapped_in(self, model: torch.nn.Module) -> Iterator[None]:
        """`model` holds the average inside the block and its own weights again after it."""
        params = self._params(model)
        own = [p.clone() for p in params]
        _copy(params, self.average)
        try:
            yield
        finally:
            _copy(params, own)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "average": dict(zip(self.names, self.average))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        _copy(self.average, [state["average"][name] for name in self.names])


@torch.no_grad()
def _copy(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    for target, source in zip(targets, sources):
        target.copy_(source)
