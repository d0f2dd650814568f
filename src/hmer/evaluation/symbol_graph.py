"""A MathML tree to the symbol label graph (symLG) that the official CROHME tools compare.

This does what CoMER's `convert2symLG` does to pandoc's MathML, in one pass over
`latex_mathml.Element` trees:

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

from .latex_mathml import Element

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


def _row(children: list[_Node]) -> _Node:
    return _Node("mrow", None, children)


def _normalise(node: _Node) -> bool:
    """One pass of CROHME's normalisation, the node before its children; True if anything changed
    (the caller repeats until nothing does)."""
    changed = False
    while True:
        kids = node.children
        if node.name == "mrow" and len(kids) > 2 or node.name == "msqrt" and len(kids) > 2:
            node.children = [kids[0], _row(kids[1:])]
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
