"""Training: the trainer and its epoch loop (trainer), optimisers and schedules (optim), the parts
it builds (setup), exact resume (resume), the final scoring on the test years (final), input
pipeline (loader) and multi-process scale-out (distributed). Checkpoint I/O lives below, in `hmer.checkpoint`."""

from .final import TrainResult
from .trainer import train

__all__ = ["TrainResult", "train"]
