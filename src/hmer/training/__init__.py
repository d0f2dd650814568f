"""Training: recipes, the trainer and its epoch loop (trainer), the parts it builds (setup), exact
resume (resume), the final scoring on the test years (final), input pipeline (loader) and
multi-process scale-out (distributed). Checkpoint I/O lives below, in `hmer.checkpoint`."""

from .recipes import RECIPES, apply_recipe
from .result import TrainResult
from .trainer import train

__all__ = ["RECIPES", "TrainResult", "apply_recipe", "train"]
