"""Training: recipes, the trainer, checkpoints and multi-process scale-out."""

from .recipes import RECIPES, apply_recipe
from .trainer import TrainResult, train

__all__ = ["RECIPES", "TrainResult", "apply_recipe", "train"]
