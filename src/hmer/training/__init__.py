"""Training: `train(cfg)`, one tracked run, and the `TrainResult` it returns (docs/architecture.md lists the
modules). Checkpoint I/O lives below, in `hmer.checkpoint`."""

from .final import TrainResult
from .trainer import train

__all__ = ["TrainResult", "train"]
