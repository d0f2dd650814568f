"""hmer: an ablation suite for handwritten mathematical expression recognition."""

__version__ = "0.1.0"
