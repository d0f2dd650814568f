"""The papers' ExpRate, ≤1 and ≤2: errors in the symbol label graph, counted as the CROHME lgeval does.

The papers score with the official pipeline CoMER ships: LaTeX to MathML with pandoc (`latex_mathml`),
MathML to a symbol label graph (`symbol_graph`), graphs compared by `lgeval`. An expression's error
count is lgeval's D_B: the paths whose label sets share no label (ABSENT where a graph lacks the path)
plus the ordered pairs of paths whose relation label sets share no label (`_` for no relation). A
truth that does not convert leaves the denominator; a prediction that does not is compared with an
empty graph. More, and the pandoc version followed (2.17.1.1, the fixtures' in `tests/fixtures/lgeval/`):
docs/reports.md, "The papers' metrics".
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from ..registry import METRICS
from .latex_mathml import NotConverted, to_mathml
from .metrics import Metric
from .symbol_graph import SymbolGraph, symbol_graph

_EMPTY = SymbolGraph({}, {})
_ABSENT = frozenset({"ABSENT"})
_NO_RELATION = frozenset({"_"})


def label_graph(tokens: Sequence[str]) -> SymbolGraph | None:
    """The symbol label graph of a token sequence, or None when pandoc would not convert it."""
    return _graph(tuple(tokens))


@lru_cache(maxsize=65536)
def _graph(tokens: tuple[str, ...]) -> SymbolGraph | None:
    try:
        return symbol_graph(to_mathml(tokens))
    except NotConverted:
        return None


def graph_errors(output: SymbolGraph, truth: SymbolGraph) -> int:
    """lgeval's D_B of `output` against `truth`: node label errors plus relation label errors."""
    nodes = sum(1 for path in output.nodes.keys() | truth.nodes.keys()
                if not output.nodes.get(path, _ABSENT) & truth.nodes.get(path, _ABSENT))
    relations = sum(1 for pair in output.edges.keys() | truth.edges.keys()
                    if not output.edges.get(pair, _NO_RELATION) & truth.edges.get(pair, _NO_RELATION))
    return nodes + relations


def expression_errors(prediction: Sequence[str], truth: Sequence[str]) -> int | None:
    """D_B of a predicted token sequence against the true one; None when the truth does not
    convert (the official pipeline then has no graph to score against)."""
    truth_graph = label_graph(truth)
    if truth_graph is None:
        return None
    return graph_errors(label_graph(prediction) or _EMPTY, truth_graph)


def errors_per_expression(predictions: Sequence[Sequence[str]], truths: Sequence[Sequence[str]]) -> np.ndarray:
    """D_B per expression as floats, NaN where the truth does not convert."""
    return np.array([np.nan if (e := expression_errors(p, t)) is None else float(e)
                     for p, t in zip(predictions, truths)], dtype=float)


def within_graph_errors(max_errors: int, label: str) -> Metric:
    """The metric of readings within `max_errors` symbol label graph errors of the truth."""
    return Metric(label, lambda d: d <= max_errors, judge=errors_per_expression)


lgeval_exprate = METRICS.register(
    "lgeval_exprate", within_graph_errors(0, "ExpRate (lgeval)"),
    description="The papers' ExpRate: no symbol label graph error (lgeval D_B = 0), in percent")
lgeval_le1 = METRICS.register(
    "lgeval_le1", within_graph_errors(1, "≤1 (lgeval)"),
    description="The papers' ≤1: at most one symbol label graph error (lgeval D_B), in percent")
lgeval_le2 = METRICS.register(
    "lgeval_le2", within_graph_errors(2, "≤2 (lgeval)"),
    description="The papers' ≤2: at most two symbol label graph errors (lgeval D_B), in percent")

# Each graph metric's counterpart among ours on token edits (`metrics`): the same question asked of the tokens.
TOKEN_METRIC = {"lgeval_exprate": "exprate", "lgeval_le1": "le1", "lgeval_le2": "le2"}
