"""The optimisers and learning-rate schedules a `TrainConfig` names, built for a model.

The recipes themselves are plain config values in `hmer.recipes` (every field stays overridable,
so `--recipe comer --set train.lr=0.04` is a CoMER run at half the learning rate):

- BTTR: Adadelta, lr 1.0, rho 0.9, eps 1e-6, weight decay 1e-4.
- CoMER: SGD, lr 0.08, momentum 0.9, weight decay 1e-4.

Both reduce the learning rate when validation ExpRate stops improving (`LRSchedule`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..config import TrainConfig


def build_optimizer(params, tc: TrainConfig) -> torch.optim.Optimizer:
    if tc.optimizer == "adadelta":
        return torch.optim.Adadelta(params, lr=tc.lr, rho=tc.rho, eps=tc.eps, weight_decay=tc.weight_decay)
    if tc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tc.lr, momentum=tc.momentum, weight_decay=tc.weight_decay)
    if tc.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=tc.lr, eps=tc.eps, weight_decay=tc.weight_decay, fused=True)
    raise ValueError(f"train.optimizer={tc.optimizer!r} is not one of adadelta, sgd, adamw")


class LRSchedule:
    """Linear warm-up over the first steps, then reduce-on-plateau on validation ExpRate
    (`train.schedule=plateau`, the papers' choice) or a cosine decay to `min_lr` at the last
    step of `train.epochs` (`train.schedule=cosine`, which needs `total_steps`).

    The warm-up scales the base learning rate per optimiser step (large batches need
    it); the plateau part multiplies the base rate by `plateau_factor` once validation
    ExpRate has not improved for `plateau_patience` validations. A fixed number of epochs on a
    small budget is what the cosine form is for: it does not wait on validation to decay.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, tc: TrainConfig, total_steps: int = 0):
        self.optimizer = optimizer
        self.warmup_steps = tc.warmup_steps
        self.cosine = tc.schedule == "cosine"
        if self.cosine and total_steps <= tc.warmup_steps:
            raise ValueError(f"train.schedule=cosine needs more steps ({total_steps}) than "
                             f"train.warmup_steps ({tc.warmup_steps})")
        self.total_steps = total_steps
        self.min_lr = tc.min_lr
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=tc.plateau_factor, patience=tc.plateau_patience,
            min_lr=tc.min_lr,
        )
        self.step_count = 0
        self._apply_warmup()

    def _apply_warmup(self) -> None:
        if self.cosine and self.step_count >= self.warmup_steps:
            progress = min(1.0, (self.step_count - self.warmup_steps) / (self.total_steps - self.warmup_steps))
            for group, base in zip(self.optimizer.param_groups, self.base_lrs):
                group["lr"] = self.min_lr + (base - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
            return
        if self.warmup_steps <= 0 or self.step_count > self.warmup_steps:
            return
        scale = min(1.0, (self.step_count + 1) / self.warmup_steps)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * scale

    def step_batch(self) -> None:
        self.step_count += 1
        self._apply_warmup()

    def step_validation(self, val_exprate: float) -> None:
        if self.cosine or self.step_count < self.warmup_steps:
            return
        before = [g["lr"] for g in self.optimizer.param_groups]
        self.plateau.step(val_exprate)
        after = [g["lr"] for g in self.optimizer.param_groups]
        # Keep the warm-up's base in step with plateau reductions.
        self.base_lrs = [b * (a / bf if bf else 1.0) for b, a, bf in zip(self.base_lrs, after, before)]

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict[str, Any]:
        return {"plateau": self.plateau.state_dict(), "step_count": self.step_count,
                "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plateau.load_state_dict(state["plateau"])
        self.step_count = int(state["step_count"])
        self.base_lrs = [float(x) for x in state["base_lrs"]]
