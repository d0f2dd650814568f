"""What one training run returns: `train(cfg)`'s result, which the final scoring fills in
(`final.py`) and the studies record on their trials."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..evaluation.metrics import Scores


@dataclass
class TrainResult:
    run_id: str
    best_val_exprate: float
    best_epoch: int
    epochs: int
    stopped_by: str  # "epochs" | "budget" | "target" (stop_at_val_exprate reached) | "paused"
    test_scores: dict[str, Scores] = field(default_factory=dict)
    # validation decoded as the test years are at the end ("val", and "val-alt" with data.val_alt)
    validation_scores: dict[str, Scores] = field(default_factory=dict)
    checkpoint: Path | None = None
    num_params: int = 0
    train_seconds: float = 0.0  # wall clock of the whole loop, validation included
    train_cpu_seconds: float = 0.0  # CPU time of the same, the process's threads summed
    step_seconds: float = 0.0  # time in training steps only (what images per second divides by)
    images_trained: int = 0  # images seen by training steps, all ranks and epochs
