"""The buckets the error analysis sorts test expressions into: by target length and by structure.

Target length (truth tokens: 1-10, 11-20, 21-40, >40) partitions a year. The structure buckets
(`\\frac`, `^ or _`, `\\sqrt`: the truth holds that token; "none of these") do not:
`x ^ { \\frac { 1 } { 2 } }` is under both `\\frac` and `^ or _`.
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
LENGTH_LABELS = [label for label, _ in LENGTH_BUCKETS]
STRUCTURE_LABELS = [label for label, _ in STRUCTURE_TOKENS] + [NO_STRUCTURE]


def length_bucket(n_tokens: int) -> str:
    """The target-length bucket of `n_tokens` (an empty truth is 1-10)."""
    return next(label for label, upper in LENGTH_BUCKETS if n_tokens <= upper)  # the last has no bound


def structures(tokens: Iterable[str]) -> list[str]:
    present = set(tokens)
    found = [label for label, marks in STRUCTURE_TOKENS if present & marks]
    return found or [NO_STRUCTURE]
