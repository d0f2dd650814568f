"""The papers' ExpRate, ≤1 and ≤2: errors in the symbol label graph, counted as the CROHME lgeval does.

The official pipeline CoMER ships, in Python: LaTeX to MathML as pandoc does (`latex_mathml`), MathML
to a symbol label graph (`symbol_graph`), graphs compared as `lgeval` does (D_B). What it counts, which
expressions, and the pandoc version followed: docs/reports.md, "The papers' metrics".

The symbol label graph (symLG) is made from pandoc's MathML as CoMER's `convert2symLG` makes it, in one
pass over `latex_mathml.Element` trees (`symbol_graph`):

1. Symbols. Every `mi` / `mo` / `mn` is a symbol labelled with its text in the tools' LaTeX spelling
   (`α` -> `\\alpha`, `<` -> `\\lt`, both `Γ` and `γ` -> `\\gamma`, `,` -> `COMMA`); a fraction adds a
   bar labelled `-` and a root a symbol `\\sqrt`. A symbol's id is its label and its position among
   the elements, as the tools number them; ids only order the relations.
2. Layout. The tree is normalised to CROHME's binary form (`_normalise`), then relations join each
   structure's main symbol to its arguments' first symbols (`_RELATIONS`): `Right` along a row, `Sub`
   / `Sup` / `Below` / `Above` from a base, `Above` / `Below` from a fraction bar, `Inside` from a
   root to its content, `Above` to its index.
3. Paths. A symbol's node is named by its path from the root: `O` and the relations down to it
   (`Right` written `R`), each symbol taking the first relation to it in the relation lines sorted as
   text, except that `Inside` gives way to a later one. Symbols whose relations are lost share the
   root's path, `O`; the graph compares the set of labels at each path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

from ..registry import METRICS
from .latex_mathml import Element, NotConverted, to_mathml
from .metrics import within

# The tools' spelling of symbol texts (the rest keep their text).
_LABELS = {
    "÷": "\\div", "×": "\\times", "±": "\\pm", "∑": "\\sum", "π": "\\pi", "∫": "\\int", "θ": "\\theta",
    "∞": "\\infty", "…": "\\ldots", "β": "\\beta", "→": "\\rightarrow", "≤": "\\leq", "≥": "\\geq",
    "<": "\\lt", ">": "\\gt", "σ": "\\sigma", "ϕ": "\\phi", "′": "\\prime", "Γ": "\\gamma", "γ": "\\gamma",
    "μ": "\\mu", "λ": "\\lambda", "Δ": "\\Delta", "∃": "\\exists", "∀": "\\forall", "∈": "\\in",
    "∂": "\\partial", "≠": "\\neq", "α": "\\alpha", "−": "-",
}
_NAMED = {"rightarrow", "sum", "int", "pi", "leq", "sin", "cos", "tan", "lim", "geq", "infty", "prime",
          "times", "alpha", "beta", "pm", "log", "}", "{"}

# The relations of each layout element: (from, to, label); from -1 is the element's own symbol,
# otherwise the main symbol of that child; to is a child, reached at its first symbol.
_RELATIONS = {
    "mrow": ((0, 1, "Right"),),
    "msup": ((0, 1, "Sup"),),
    "msub": ((0, 1, "Sub"),),
    "msubsup": ((0, 1, "Sub"), (0, 2, "Sup")),
    "munder": ((0, 1, "Below"),),
    "mover": ((0, 1, "Above"),),
    "munderover": ((0, 1, "Below"), (0, 2, "Above")),
    "mfrac": ((-1, 0, "Above"), (-1, 1, "Below")),
    "msqrt": ((-1, 0, "Inside"), (-1, 1, "Inside"), (0, 1, "Right")),
    "mroot": ((-1, 0, "Inside"), (-1, 1, "Above")),
}
# Which child holds an element's main symbol (-1: the element's own symbol).
_MAIN = {"mrow": 1, "msup": 0, "msub": 0, "msubsup": 0, "munder": 0, "mover": 0, "munderover": 0,
         "mfrac": -1, "msqrt": -1, "mroot": -1, "mi": -1}
_OWN_SYMBOL = {"mfrac": "-", "msqrt": "\\sqrt", "mroot": "\\sqrt"}
_PATH_STEP = {"Right": "R"}


def tool_label(text: str) -> str:
    """A symbol's label as the tools write it (`α` -> `\\alpha`, `,` -> `COMMA`)."""
    label = "\\" + text if text in _NAMED else _LABELS.get(text, text)
    return label.replace(",", "COMMA", 1)


@dataclass
class _Node:
    """An element of the tools' layout tree: its own symbol id, if it has one."""

    name: str
    id: str | None
    children: list[_Node] = field(default_factory=list)
    main: str | None = None
    first_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SymbolGraph:
    """The symLG as lgeval reads it: the labels at each path, and the relation labels of each
    ordered pair of distinct paths."""

    nodes: dict[str, frozenset[str]]
    edges: dict[tuple[str, str], frozenset[str]]


def symbol_graph(root: Element) -> SymbolGraph:
    """The symbol label graph of one expression's MathML tree."""
    labels: dict[str, str] = {}
    tree = _layout_tree(root, labels)
    while _normalise(tree):
        pass
    relations: dict[tuple[str | None, str | None], str] = {}
    _relate(tree, relations)
    lines = sorted(((f"[{a}],[{b}]", a, b, rel) for (a, b), rel in relations.items() if a and b))
    parent: dict[str, tuple[str, str]] = {}
    for _, a, b, rel in lines:
        if b not in parent or parent[b][1] == "Inside":
            parent[b] = (a, rel)
    paths = {sid: _path(sid, parent) for sid in labels}
    nodes: dict[str, set[str]] = {}
    for sid, label in labels.items():
        nodes.setdefault(paths[sid], set()).add(label)
    edges: dict[tuple[str, str], set[str]] = {}
    for _, a, b, rel in lines:
        if a in paths and b in paths and paths[a] != paths[b]:
            edges.setdefault((paths[a], paths[b]), set()).add(rel)
    return SymbolGraph({p: frozenset(s) for p, s in nodes.items()}, {e: frozenset(s) for e, s in edges.items()})


def _layout_tree(root: Element, labels: dict[str, str]) -> _Node:
    """The tools' tree with symbol ids; `labels` gets each symbol's label by id. Elements are
    numbered in document order from 1 (0 is pandoc's `<semantics>`)."""
    counter = iter(range(1, 1 << 30))

    def build(element: Element) -> _Node:
        number = next(counter)
        sid = None
        if element.name == "mi":
            label = tool_label(element.text or "")
            sid = f"{label}_{number}".replace(",", "COMMA", 1)
            labels[sid] = label
        elif element.name in _OWN_SYMBOL:
            sid = f"_{number}"
            labels[sid] = _OWN_SYMBOL[element.name]
        return _Node(element.name, sid, [build(child) for child in element.children])

    return build(root)


def _normalise(node: _Node) -> bool:
    """One pass of CROHME's normalisation, the node before its children; True if anything changed
    (the caller repeats until nothing does)."""
    changed = False
    while True:
        kids = node.children
        if node.name == "mrow" and len(kids) > 2 or node.name == "msqrt" and len(kids) > 2:
            node.children = [kids[0], _Node("mrow", None, kids[1:])]
        elif node.name == "mrow" and len(kids) == 1:
            only = kids[0]
            node.name, node.id, node.children = only.name, only.id, only.children
        elif node.name in ("mrow", "msqrt") and len(kids) == 2 and kids[0].name == "mrow":
            node.children = kids[0].children + [kids[1]]
        elif node.name == "msqrt" and len(kids) == 1 and kids[0].name == "mrow":
            node.children = list(kids[0].children)
        elif node.name in ("msub", "msup") and len(kids) == 2 and kids[0].name == "mrow" and kids[0].children:
            row = kids[0].children
            script = _Node(node.name, node.id, [row[-1], kids[1]])
            node.name, node.id, node.children = "mrow", None, row[:-1] + [script]
        else:
            break
        changed = True
    for child in node.children:
        changed |= _normalise(child)
    return changed


def _relate(node: _Node, relations: dict[tuple[str | None, str | None], str]) -> list[str]:
    """Children first: each node's main symbol and first symbols, then its relations. Returns the
    ids of the node's subtree in document order."""
    below: list[str] = []
    for child in node.children:
        below += _relate(child, relations)
    node.first_ids = below
    which = _MAIN.get(node.name)
    if which == -1:
        node.main = node.id
    elif which is not None:
        node.main = node.children[which].main if which < len(node.children) else None
    for source, target, label in _RELATIONS.get(node.name, ()):
        if target >= len(node.children):
            continue
        start = node.main if source == -1 else (node.children[source].main if source < len(node.children) else None)
        goal = node.children[target]
        end = goal.id if goal.id is not None else (goal.first_ids[0] if goal.first_ids else None)
        if end is not None:
            relations[(start, end)] = label
    return ([node.id] if node.id is not None else []) + below


def _path(sid: str, parent: dict[str, tuple[str, str]]) -> str:
    steps = []
    while sid in parent:
        sid, rel = parent[sid]
        steps.append(_PATH_STEP.get(rel, rel))
    return "O" + "".join(reversed(steps))


# ---- lgeval's measure ---------------------------------------------------------------------------

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


lgeval_exprate = METRICS.register(
    "lgeval_exprate", within(0, "ExpRate (lgeval)", errors_per_expression),
    description="The papers' ExpRate: no symbol label graph error (lgeval D_B = 0), in percent")
lgeval_le1 = METRICS.register(
    "lgeval_le1", within(1, "≤1 (lgeval)", errors_per_expression),
    description="The papers' ≤1: at most one symbol label graph error (lgeval D_B), in percent")
lgeval_le2 = METRICS.register(
    "lgeval_le2", within(2, "≤2 (lgeval)", errors_per_expression),
    description="The papers' ≤2: at most two symbol label graph errors (lgeval D_B), in percent")

# Each graph metric's counterpart among ours on token edits (`metrics`): the same question asked of the tokens.
TOKEN_METRIC = {"lgeval_exprate": "exprate", "lgeval_le1": "le1", "lgeval_le2": "le2"}
