"""The buckets the error analysis sorts test expressions into: by target length and by structure.

Target length is the number of tokens of the truth: 1-10, 11-20, 21-40, >40; these
partition a year's expressions. The structure buckets are *not* a partition: an expression
is in `\\frac` when its truth holds a `\\frac` token, in `^ or _` when it holds `^` or `_`,
in `\\sqrt` when it holds `\\sqrt`, and in "none of these" when it holds none of them.
`x ^ { \\frac { 1 } { 2 } }` counts under both `\\frac` and `^ or _`, so the structure rows
add up to at least the year's size; "none of these" plus the expressions in at least one
structure bucket add up to exactly the year's size.
"""

from __future__ import annotations

import math
from typing import Iterable

LENGTH_BUCKETS: tuple[tuple[str, float], ...] = (("1-10", 10), ("11-20", 20), ("21-40", 40), (">40", math.inf))
STRUCTURE_TOKENS: tuple[tuple[str, frozenset[str]], ...] = (
    ("\\frac", frozenset({"\\frac"})),
    ("^ or _", frozenset({"^", "_"})),
    ("\\sqrt", frozenset({"\\sqrt"})),
)
NO_STRUCTURE = "none of these"
ALL = "all"  # the bucket of every expression (axis "all")
AXES = ("all", "length", "structure")


def length_bucket(n_tokens: int) -> str:
    """The target-length bucket of a truth of `n_tokens` tokens (an empty truth counts as 1-10)."""
    for label, upper in LENGTH_BUCKETS:
        if n_tokens <= upper:
            return label
    raise AssertionError("unreachable: the last bucket has no upper bound")


def structures(tokens: Iterable[str]) -> list[str]:
    """The structure buckets of a truth: any of \\frac, "^ or _", \\sqrt, else ["none of these"]."""
    present = set(tokens)
    found = [label for label, marks in STRUCTURE_TOKENS if present & marks]
    return found or [NO_STRUCTURE]


def length_labels() -> list[str]:
    """The length buckets in order."""
    return [label for label, _ in LENGTH_BUCKETS]


def structure_labels() -> list[str]:
    """The structure buckets in order, "none of these" last."""
    return [label for label, _ in STRUCTURE_TOKENS] + [NO_STRUCTURE]
