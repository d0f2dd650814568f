"""The optimisers and learning-rate schedules a `TrainConfig` names (the recipes are config values: `hmer.recipes`).

Large batches: a recipe's lr was set at a reference batch; k times larger batches take k times fewer steps an
epoch, and `train.lr_scaling` keeps the per-epoch curve where it was (`batch_scaled_lr`: lr x k for SGD, lr x
sqrt(k) for adaptive optimisers; sources in `TrainConfig`), with `train.warmup_epochs` in the batch's own steps.
docs/benchmarks.md section 4 measures them on the CPU.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..config import TrainConfig


def build_optimizer(params, tc: TrainConfig, lr: float | None = None) -> torch.optim.Optimizer:
    """The optimiser `tc` names, at learning rate `lr` (default: train.lr; see `batch_scaled_lr`)."""
    lr = tc.lr if lr is None else lr
    if tc.optimizer == "adadelta":
        return torch.optim.Adadelta(params, lr=lr, rho=tc.rho, eps=tc.eps, weight_decay=tc.weight_decay)
    if tc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=tc.momentum, weight_decay=tc.weight_decay)
    if tc.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, eps=tc.eps, weight_decay=tc.weight_decay, fused=True)
    raise ValueError(f"train.optimizer={tc.optimizer!r} is not one of adadelta, sgd, adamw")


def batch_scaled_lr(tc: TrainConfig, steps_per_epoch: int, reference_steps_per_epoch: int) -> tuple[float, float]:
    """(learning rate, k): train.lr scaled by `train.lr_scaling`, k = reference steps / steps an epoch.
    Steps, not the batch settings, because a pixel budget and an image cap together decide a step's images."""
    k = reference_steps_per_epoch / max(steps_per_epoch, 1)
    if tc.lr_scaling == "linear":
        return tc.lr * k, k
    if tc.lr_scaling == "sqrt":
        return tc.lr * math.sqrt(k), k
    return tc.lr, k


def warmup_steps(tc: TrainConfig, steps_per_epoch: int) -> int:
    """The warm-up in optimiser steps: train.warmup_steps, or train.warmup_epochs of this batch's steps."""
    if tc.warmup_epochs > 0:
        return int(math.ceil(tc.warmup_epochs * steps_per_epoch))
    return tc.warmup_steps


class LRSchedule:
    """Linear warm-up per step, then one of `train.schedule`: `plateau` (the papers': the rate x `plateau_factor`
    after `plateau_patience` validations without a better ExpRate), `cosine` (to `min_lr` at the last step, which
    needs `total_steps`; for fixed epochs on a small budget: it does not wait on validation) or `wsd` (held, then
    decayed to `min_lr` over the last `train.decay_epochs`).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, tc: TrainConfig, total_steps: int = 0,
                 warmup: int | None = None):
        self.optimizer = optimizer
        self.warmup_steps = tc.warmup_steps if warmup is None else warmup
        self.cosine = tc.schedule == "cosine"
        self.wsd = tc.schedule == "wsd"
        if self.cosine and total_steps <= self.warmup_steps:
            raise ValueError(f"train.schedule=cosine needs more steps ({total_steps}) than "
                             f"its warm-up ({self.warmup_steps})")
        self.total_steps = total_steps
        # wsd: the step where the decay begins, at an epoch's end (total_steps is whole epochs)
        self.decay_start = total_steps // tc.epochs * (tc.epochs - tc.decay_epochs) if self.wsd else total_steps
        if self.wsd and self.decay_start < self.warmup_steps:
            raise ValueError(f"train.schedule=wsd decays from step {self.decay_start}, inside its warm-up "
                             f"({self.warmup_steps} steps): fewer train.decay_epochs")
        self.min_lr = tc.min_lr
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=tc.plateau_factor,
                                                                  patience=tc.plateau_patience, min_lr=tc.min_lr)
        self.step_count = 0
        self._apply_warmup()

    def _apply_warmup(self) -> None:
        if self.wsd and self.step_count >= self.decay_start:
            # 1 - sqrt: the cooldown that Hägele et al. found best for a decay of a fifth of the steps
            progress = min(1.0, (self.step_count - self.decay_start) / max(1, self.total_steps - self.decay_start))
            for group, base in zip(self.optimizer.param_groups, self.base_lrs):
                group["lr"] = self.min_lr + (base - self.min_lr) * (1.0 - math.sqrt(progress))
            return
        if self.wsd and self.step_count > self.warmup_steps:  # the stable phase: the base rate itself
            for group, base in zip(self.optimizer.param_groups, self.base_lrs):
                group["lr"] = base
            return
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

    def refresh(self) -> None:
        """Set the current step's rate from this schedule: a state restored from a wsd branch carries its rate."""
        self._apply_warmup()

    def step_validation(self, val_exprate: float) -> None:
        if self.cosine or self.wsd or self.step_count < self.warmup_steps:
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
        return {"plateau": self.plateau.state_dict(), "step_count": self.step_count, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plateau.load_state_dict(state["plateau"])
        self.step_count = int(state["step_count"])
        self.base_lrs = [float(x) for x in state["base_lrs"]]
