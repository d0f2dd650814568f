"""Evaluation: ExpRate / <=1 / <=2 metrics (`metrics`) and decoding + scoring a split (`evaluate`).

    from hmer.evaluation import expression_metrics, Scores
    scores = expression_metrics(predictions, truths)      # lists of token lists
    scores.exprate, scores.le1, scores.le2, scores.n, scores.distances
    scores.as_dict("test_2014")                           # {"test_2014_exprate": ..., ...}

`evaluate.evaluate_split` is imported from its module (it pulls in data and decoding).
"""

from . import lgeval  # noqa: F401 - registers the papers' graph measures beside the token ones (METRICS' home)
from .metrics import Scores, expression_metrics, token_distance

__all__ = ["Scores", "expression_metrics", "token_distance"]
